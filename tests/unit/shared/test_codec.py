"""The event codec: golden payloads keep decoding, and every bad message gets a one-line reason."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.golden_payloads import golden_payloads, json_paths
from warmplane.shared.codec import DecodeFailure, EventCodec
from warmplane.shared.events import EVENT_TYPES, Event

GOLDEN = golden_payloads()
Json = Any
"""A value `json.loads` returns (None, bool, int, float, str, list, dict): too recursive to spell usefully."""
Path = tuple[str | int, ...]

json_values: st.SearchStrategy[Json] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=12,
)


def golden_dict(event_type: str) -> dict[str, Json]:
    loaded: dict[str, Json] = json.loads(GOLDEN[event_type])
    return loaded


def encode_json(value: Json) -> bytes:
    return json.dumps(value).encode()


def assert_failure(result: Event | DecodeFailure) -> DecodeFailure:
    """`result` is a failure whose reason is fit for a header: non-empty, one line."""
    assert isinstance(result, DecodeFailure), f"expected a failure, decoded {result!r}"
    assert result.reason.strip(), "empty reason"
    assert "\n" not in result.reason and "\r" not in result.reason, result.reason
    return result


def assert_decodes_or_explains(codec: EventCodec, data: bytes | None) -> None:
    result = codec.decode(data)
    if isinstance(result, DecodeFailure):
        assert_failure(result)
    else:
        assert isinstance(result, Event)
        assert codec.decode(codec.encode(result)) == result


def test_every_event_type_has_a_golden_payload() -> None:
    assert set(GOLDEN) == set(EVENT_TYPES)


@pytest.mark.parametrize("event_type", sorted(GOLDEN))
def test_golden_payload_decodes_to_its_type_and_round_trips(event_type: str) -> None:
    codec = EventCodec()
    event = codec.decode(GOLDEN[event_type])
    assert type(event) is EVENT_TYPES[event_type]
    assert isinstance(event, Event)
    assert codec.decode(codec.encode(event)) == event


@pytest.mark.parametrize("event_type", sorted(GOLDEN))
def test_unknown_fields_are_ignored(event_type: str) -> None:
    codec = EventCodec()
    evolved = golden_dict(event_type)
    evolved["added_later"] = {"nested": [1, 2, 3]}
    evolved["model"]["quantization"] = "fp8"
    if isinstance(evolved.get("payload"), dict):
        evolved["payload"]["cache_salt"] = "s1"
    assert codec.decode(encode_json(evolved)) == codec.decode(GOLDEN[event_type])


def _request(**changes: Json) -> bytes:
    payload = golden_dict("request.observed")
    payload.update(changes)
    return encode_json(payload)


def _residency(**changes: Json) -> bytes:
    payload = golden_dict("replica.residency")
    payload.update(changes)
    return encode_json(payload)


def _future_shape() -> bytes:
    """Version 2 of a type may drop or retype version 1 fields: still reported as from the future."""
    payload = golden_dict("request.observed")
    del payload["chain_tokens"]
    payload.update(schema_version=2, prompt_tokens="many")
    return encode_json(payload)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(GOLDEN["request.observed"][:80], "truncated", id="truncated-json"),
        pytest.param(b'{"type": "request.observed"', "truncated", id="truncated-object"),
        pytest.param(b"[1, 2]", "not a JSON event object", id="array"),
        pytest.param(b'"request.observed"', "not a JSON event object", id="string"),
        pytest.param(b"42", "not a JSON event object", id="number"),
        pytest.param(b"null", "not a JSON event object", id="json-null"),
        pytest.param(b"", "not a JSON event object", id="empty-bytes"),
        pytest.param(b"\xff\xfe{", "not a JSON event object", id="not-utf8"),
        pytest.param(
            _request(type="request.teleported"), "unknown event type 'request.teleported'", id="unknown"
        ),
        pytest.param(b'{"producer": "x"}', "unknown event type ''", id="no-type"),
        pytest.param(_request(schema_version=2), "newer", id="future-version"),
        pytest.param(_future_shape(), "newer", id="future-version-new-shape"),
        pytest.param(
            _request(cached_tokens=1302), "`cached_tokens` cannot exceed `prompt_tokens`", id="cached"
        ),
        pytest.param(_request(chain_tokens=[512, 1024]), "same length", id="chain-length"),
        pytest.param(_request(chain_tokens=[512, 400, 1300]), "must not decrease", id="chain-tokens-down"),
        pytest.param(
            _request(payload={"prefix_id": 7, "prompt": "hi"}), "must be an element of `chain`", id="payload"
        ),
        pytest.param(_request(occurred_at="2026-11-29T12:00:00.123000"), "timezone", id="naive-datetime"),
        pytest.param(_request(prompt_tokens=-1), "`$.prompt_tokens`", id="negative-tokens"),
        pytest.param(_request(event_id="not-a-uuid"), "`$.event_id`", id="bad-uuid"),
        pytest.param(_residency(held=[["ac\u0000me", "", 1, [7]]]), "must not contain NUL", id="nul-tenant"),
        pytest.param(_residency(held=[["acme", "", -1, [7]]]), "`$.held[0][2]`", id="negative-epoch"),
    ],
)
def test_failure_reasons(data: bytes, expected: str) -> None:
    failure = assert_failure(EventCodec().decode(data))
    assert expected in failure.reason


def test_invalid_fields_name_the_event_type() -> None:
    failure = assert_failure(EventCodec().decode(_request(cached_tokens=1302)))
    assert failure.reason.startswith("invalid request.observed:")
    assert failure.event_type == "request.observed"


def test_future_version_names_the_type_and_both_versions() -> None:
    failure = assert_failure(EventCodec().decode(_request(schema_version=2)))
    assert failure.event_type == "request.observed"
    assert "schema_version 2" in failure.reason and "up to 1" in failure.reason


def test_messages_over_the_cap_are_refused_and_one_at_the_cap_decodes() -> None:
    data = GOLDEN["request.observed"]
    assert isinstance(EventCodec(max_event_bytes=len(data)).decode(data), Event)
    failure = assert_failure(EventCodec(max_event_bytes=len(data) - 1).decode(data))
    assert f"message of {len(data)} bytes exceeds max_event_bytes={len(data) - 1}" == failure.reason


def test_encoding_over_the_cap_raises() -> None:
    event = EventCodec().decode(GOLDEN["request.observed"])
    assert isinstance(event, Event)
    with pytest.raises(ValueError, match="exceeds max_event_bytes=100"):
        EventCodec(max_event_bytes=100).encode(event)


def test_none_is_an_empty_message() -> None:
    assert assert_failure(EventCodec().decode(None)).reason == "empty message (tombstone)"


def test_deeply_nested_json_is_a_failure_not_an_exception() -> None:
    depth = 5_000  # 10 to 30 kB: well under the size cap
    nested_object = b'{"a":' * depth + b"1" + b"}" * depth
    request_with_nested_field = b'{"x":' + b"[" * depth + b"]" * depth + b"," + _request()[1:]
    for data in (nested_object, request_with_nested_field):
        assert_failure(EventCodec().decode(data))


@settings(max_examples=200)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    assert_decodes_or_explains(EventCodec(), data)


@settings(max_examples=200)
@given(json_values)
def test_arbitrary_json_never_raises(value: Json) -> None:
    assert_decodes_or_explains(EventCodec(), encode_json(value))


def _parent(document: Json, path: Path) -> Any:
    for step in path[:-1]:
        document = document[step]
    return document


@st.composite
def mutations(draw: st.DrawFn, document: Json) -> Json:
    """`document` with one field deleted or one value (perhaps the whole document) replaced."""
    paths = list(json_paths(document))
    path: Path = draw(st.sampled_from(paths))
    delete: bool = draw(st.booleans())
    if path and delete:
        del _parent(document, path)[path[-1]]
        return document
    replacement = draw(json_values)
    if not path:
        return replacement
    _parent(document, path)[path[-1]] = replacement
    return document


@settings(max_examples=200)
@given(st.data())
def test_mutated_golden_payloads_never_raise(data: st.DataObject) -> None:
    document: Json = copy.deepcopy(golden_dict(data.draw(st.sampled_from(sorted(GOLDEN)))))
    for _ in range(data.draw(st.integers(1, 3))):
        document = data.draw(mutations(document))
    assert_decodes_or_explains(EventCodec(), encode_json(document))
