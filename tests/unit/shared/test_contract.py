"""The published contract (`docs/contract`, from `shared/contract.py`): the committed files are what the code
generates, every golden payload is valid under the schema and broken ones are not, every event is on the
channel it is published to with the key it is published under, and the prefix ids and the ring's owners
follow from the README's description alone (implementations written here from it, without `prefix_chain`
or `hash_ring`)."""

from __future__ import annotations

import bisect
import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.golden_payloads import golden_payloads
from warmplane.shared.codec import DecodeFailure, EventCodec
from warmplane.shared.contract import ASYNCAPI_FILE, RING_FILE, SCHEMA_FILE, VECTORS_FILE, documents
from warmplane.shared.events import EVENT_TYPES
from warmplane.shared.topics import Topics, partition_key

FOLDER = Path(__file__).resolve().parents[3] / "docs" / "contract"


def _load(name: str) -> Any:
    return json.loads((FOLDER / name).read_text())


def test_the_committed_documents_are_what_the_code_generates() -> None:
    for name, text in documents().items():
        assert (FOLDER / name).read_text() == text, (
            f"run: python -m warmplane.shared.contract docs/contract ({name})"
        )


def _validator() -> jsonschema.Draft202012Validator:
    schema = _load(SCHEMA_FILE)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def test_every_golden_payload_is_valid_and_every_type_has_one() -> None:
    validator = _validator()
    payloads = golden_payloads()
    assert sorted(payloads) == sorted(EVENT_TYPES)
    for kind, raw in payloads.items():
        errors = [error.message for error in validator.iter_errors(json.loads(raw))]
        assert errors == [], (kind, errors)


@pytest.mark.parametrize(
    ("kind", "change"),
    [
        ("request.observed", {"type": "request.seen"}),
        ("request.observed", {"chain": []}),
        ("request.observed", {"prompt_tokens": -1}),
        ("request.observed", {"event_id": "not-a-uuid"}),
        ("request.observed", {"tenant": ""}),
        ("replica.started", {"replica": None}),
        ("warm_plan.issued", {"items": "none"}),
    ],
)
def test_a_payload_the_codec_refuses_the_schema_refuses(kind: str, change: dict[str, Any]) -> None:
    payload = json.loads(golden_payloads()[kind]) | change
    assert isinstance(EventCodec().decode(json.dumps(payload).encode()), DecodeFailure), (
        "the codec refuses it"
    )
    assert list(_validator().iter_errors(payload)), "and so does the schema"


def test_each_event_is_on_the_channel_it_is_published_to_with_its_key() -> None:
    document = _load(ASYNCAPI_FILE)
    assert document["asyncapi"] == "3.0.0"
    topics = Topics("p")
    codec = EventCodec()
    for kind, raw in golden_payloads().items():
        event = codec.decode(raw)
        assert not isinstance(event, DecodeFailure)
        [channel] = [name for name, c in document["channels"].items() if kind in c["messages"]]
        assert document["channels"][channel]["address"].replace("{prefix}", "p") == topics.for_event(event)
        says = document["components"]["messages"][kind]["bindings"]["kafka"]["key"]["description"]
        template = says.split(":")[0]
        fields = json.loads(raw)
        made = template.format(**{k: _Fields(v) if isinstance(v, dict) else v for k, v in fields.items()})
        assert made.encode() == partition_key(event), (kind, template)
    signed = {
        name
        for name, c in document["channels"].items()
        for kind in c["messages"]
        if "headers" in document["components"]["messages"][kind] and name != "dead-letter"
    }
    assert signed == {"lifecycle", "heartbeats", "plans"}


class _Fields:
    """A JSON object whose fields a format template reads as attributes (`{model.name}`)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)


def _id(key: bytes, data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, key=key).digest(), "big", signed=True)


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _segments(case: dict[str, Any], chunk_chars: int, chunk_tokens: int) -> list[bytes]:
    if "messages" in case:
        segments = []
        for message in case["messages"]:
            content = message.get("content")
            if not isinstance(content, str) or len(content) <= chunk_chars:
                segments.append(b"m\x00" + _canonical(message))
                continue
            head = _canonical({k: v for k, v in message.items() if k != "content"})
            for start in range(0, len(content), chunk_chars):
                piece = content[start : start + chunk_chars].encode()
                segments.append(b"m\x00" + (head if start == 0 else b"") + piece)
        return segments
    if "prompt" in case:
        text = case["prompt"]
        return [
            b"t\x00" + text[s : s + chunk_chars].encode() for s in range(0, max(len(text), 1), chunk_chars)
        ]
    ids = case["prompt_token_ids"]
    return [
        b"k\x00" + b"".join(i.to_bytes(8, "big", signed=True) for i in ids[s : s + chunk_tokens])
        for s in range(0, len(ids), chunk_tokens)
    ]


def test_the_readme_alone_gives_the_published_prefix_ids() -> None:
    vectors = _load(VECTORS_FILE)
    assert len(vectors["cases"]) >= 8
    for case in vectors["cases"]:
        space = case["namespace"]
        parent = _id(b"warmplane/v1", _canonical([space["tenant"], space["model"], space["prompt_rev"]]))
        assert parent == case["root_parent"], case["name"]
        ids = []
        for segment in _segments(case, vectors["chunk_chars"], vectors["chunk_tokens"]):
            parent = _id(parent.to_bytes(8, "big", signed=True), segment)
            ids.append(parent)
        assert ids == case["ids"], case["name"]
    assert any(len(case["ids"]) > 1 and "cut" in case["name"] for case in vectors["cases"])


def _mix(x: int) -> int:
    mask = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


def _key_point(key: int) -> int:
    return _mix(struct.unpack(">Q", struct.pack(">q", key))[0])


def _ring(
    members: dict[str, float], vnodes: int, rounding: Callable[[float], int] = round
) -> list[tuple[int, str, int]]:
    """Every point as (point, member, index), sorted: by point, then name by code point, then index."""
    points = []
    for member, weight in members.items():
        for index in range(max(1, rounding(vnodes * weight))):
            digest = hashlib.blake2b(f"{member}\x00{index}".encode(), digest_size=8).digest()
            points.append((struct.unpack(">Q", digest)[0], member, index))
    return sorted(points)


def _preference(ring: list[tuple[int, str, int]], key: int) -> list[str]:
    start = bisect.bisect_left(ring, (_key_point(key),))
    order: list[str] = []
    for step in range(len(ring)):
        member = ring[(start + step) % len(ring)][1]
        if member not in order:
            order.append(member)
    return order


def test_the_readme_alone_gives_the_published_ring_owners() -> None:
    fleets = _load(RING_FILE)["fleets"]
    assert sorted(len(fleet["members"]) for fleet in fleets) == [1, 3, 3, 8]
    for fleet in fleets:
        ring = _ring(fleet["members"], fleet["vnodes"])
        for case in fleet["cases"]:
            assert case["point"] == _key_point(case["key"]), (fleet["name"], case["key"])
            order = _preference(ring, case["key"])
            assert case["owner"] == order[0], (fleet["name"], case["key"])
            assert case["preference"] == order[: min(4, len(order))], (fleet["name"], case["key"])


def test_the_ring_vectors_reach_every_member_the_wrap_and_the_rounding() -> None:
    fleets = _load(RING_FILE)["fleets"]
    keys = {key for fleet in fleets for key in (case["key"] for case in fleet["cases"])}
    assert {0, -1, 2**63 - 1, -(2**63)} <= keys
    for fleet in fleets:
        last = _ring(fleet["members"], fleet["vnodes"])[-1][0]
        assert any(case["point"] > last for case in fleet["cases"]), f"{fleet['name']}: no key wraps"
        assert {case["owner"] for case in fleet["cases"]} == set(fleet["members"]), fleet["name"]
    [small] = [fleet for fleet in fleets if fleet["vnodes"] * min(fleet["members"].values()) == 0.5]
    half_up = _ring(small["members"], small["vnodes"], lambda x: int(x + 0.5))
    assert any(case["owner"] != _preference(half_up, case["key"])[0] for case in small["cases"]), (
        "rounding halves up instead of to even goes unseen"
    )
