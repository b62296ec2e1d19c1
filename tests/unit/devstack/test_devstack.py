"""The development stack's pure parts (`services/devstack`): the history's split, recorded events that
chain as the gateway's do, the proof's choice of requests and its figures, the autoscaler's arithmetic,
and the credentials file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from warmplane.services.devstack.autoscaler import DevAutoscaler
from warmplane.services.devstack.chat_load import Sample
from warmplane.services.devstack.history import LIVE_S, PAYLOAD_DEPTHS, recorded_event, split_history
from warmplane.services.devstack.product import Credentials, InvalidCredentials
from warmplane.services.devstack.proof import Side, routed_to
from warmplane.services.gateway.openai_request import chain_of, decode
from warmplane.services.gateway.settings import RoutingSettings
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import FleetScaled, ModelRef
from warmplane.shared.hash_ring import HashRing
from warmplane.shared.mooncake_trace import TraceRequest
from warmplane.shared.prefix_chain import Namespace
from warmplane.shared.settings import KafkaSettings

WORDS = [f"w{i:03d}" for i in range(300)]
START = datetime(2026, 12, 1, tzinfo=UTC)


def _request(at_ms: int, *hash_ids: int) -> TraceRequest:
    return TraceRequest(
        timestamp=at_ms, input_length=512 * len(hash_ids), output_length=40, hash_ids=list(hash_ids)
    )


def test_the_history_is_the_first_requests_its_last_minute_live_and_the_rest_the_tail() -> None:
    trace = [_request(i * 1_000, 7, 1_000 + i % 50, 5_000 + i) for i in range(300)]
    history = split_history(trace, 200, WORDS)
    assert history.tail == trace[200:]
    last = trace[199].timestamp
    assert all(r.timestamp < last - LIVE_S * 1000 for r in history.recorded)
    assert len(history.recorded) == 139  # 0 .. 138 s; the live minute is 139 .. 199 s
    assert 0 < len(history.live) < 61  # a share of the minute's conversations
    assert all(len(c.messages) == 3 and c.messages[0]["role"] == "system" for c in history.live)


def test_a_recorded_event_chains_as_the_gateway_chains_the_same_request() -> None:
    request = _request(1_500, 7, 11, 13, 17, 19)
    catalogued: set[int] = set()
    event = recorded_event(request, WORDS, start=START, tenant="demo", model="m", catalogued=catalogued)
    assert event.occurred_at == START + timedelta(milliseconds=1_500)
    assert event.payload is not None and event.payload.messages is not None
    body = {"model": "m", "messages": [*event.payload.messages, {"role": "user", "content": "x"}]}
    sent = decode(json.dumps(body).encode(), "chat")
    gateway = chain_of(sent, Namespace("demo", "m"))
    depth = PAYLOAD_DEPTHS[0]
    assert event.chain[:depth] == list(gateway.ids[:depth])  # one catalogue, whoever saw the request
    assert event.payload.prefix_id == event.chain[depth - 1]
    again = recorded_event(request, WORDS, start=START, tenant="demo", model="m", catalogued=catalogued)
    assert again.payload is None  # each chain element's payload goes once
    other = recorded_event(request, WORDS, start=START, tenant="acme", model="m", catalogued=set())
    assert set(other.chain).isdisjoint(event.chain)  # tenants never share an id


def test_the_proof_takes_the_tails_requests_the_full_weight_ring_gives_the_newcomer() -> None:
    tail = [_request(i, 7, 100 + i, 200 + i) for i in range(200)]
    routing = RoutingSettings(depth=1)
    chosen = routed_to(
        tail, WORDS, replica="r1", replicas=["r0", "r1"], routing=routing, tenant="t", model="m", count=10
    )
    assert len(chosen) == 10
    ring = HashRing(["r0", "r1"], vnodes=routing.vnodes, load_factor=routing.load_factor)
    for request in chosen:
        body = {"model": "m", "messages": request.messages}
        ids = chain_of(decode(json.dumps(body).encode(), "chat"), Namespace("t", "m")).ids
        assert ring.owner(ids[1]) == "r1"
    rest = routed_to(tail, WORDS, replica="r0", replicas=["r0", "r1"], routing=routing, tenant="t", model="m")
    assert {c.key for c in rest}.isdisjoint(c.key for c in chosen)


def test_a_side_reports_medians_and_shares_and_refuses_a_failed_request() -> None:
    samples = [
        Sample(0.0, t, "r", 200, prompt_tokens=100, cached_tokens=c)
        for t, c in ((0.1, 50), (0.3, 0), (0.2, 25))
    ]
    side = Side.of(samples)
    assert side.p50_ms == pytest.approx(200)
    assert side.cached_share == pytest.approx(0.25)
    with pytest.raises(RuntimeError, match="503 busy"):
        Side.of([*samples, Sample(0.0, None, None, 503, error="busy")])


@dataclass(frozen=True)
class _Driver:
    replica: str


@dataclass
class _Fleet:
    """What the autoscaler uses of `Fleet`: its model, its count, and scheduling one more."""

    model: str = "m"
    scheduled: list[str] = field(default_factory=list)

    @property
    def replicas(self) -> int:
        return len(self.scheduled)

    def schedule(self) -> _Driver:
        self.scheduled.append(f"replica-{self.replicas}")
        return _Driver(self.scheduled[-1])


def _scaled(to: int, model: str = "m") -> FleetScaled:
    return FleetScaled(
        event_id=new_event_id(),
        occurred_at=START,
        producer="api:test",
        model=ModelRef(model),
        from_replicas=1,
        to_replicas=to,
    )


def test_the_autoscaler_starts_only_the_replicas_a_scale_up_lacks() -> None:
    fleet = _Fleet(scheduled=["replica-0"])
    autoscaler = DevAutoscaler(fleet, KafkaSettings())  # type: ignore[arg-type]
    autoscaler.scale(_scaled(3))  # the arithmetic, without a broker
    assert fleet.scheduled == ["replica-0", "replica-1", "replica-2"]
    assert autoscaler.scheduled.qsize() == 2
    autoscaler.scale(_scaled(2))  # a scale down starts and stops nothing
    autoscaler.scale(_scaled(3))  # nor does one to the count it has
    assert fleet.replicas == 3 and autoscaler.scheduled.qsize() == 2


def test_a_credentials_file_pins_what_it_names_and_the_rest_is_generated(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps({"api_key": "sk-pinned-0123456789", "event_key": "e" * 32}))
    pinned = Credentials.read(path)
    assert pinned.api_key.get_secret_value() == "sk-pinned-0123456789"
    assert pinned.event_key.get_secret_value() == "e" * 32
    again = Credentials.read(path)
    assert again.api_key == pinned.api_key and again.admin_token != pinned.admin_token, "the rest generated"
    assert len(pinned.tenant_secret.get_secret_value()) >= 16


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"api_key": "short-leak"}', "api_key: Value should have at least 16"),
        ('{"event_key": "sixteen-chars-leak"}', "event_key: Value should have at least 32"),
        ('{"api_keys": ["0123456789abcdef-leak"]}', "api_keys: Extra inputs are not permitted"),
        ('{"api_key": "0123456789abcdef-leak"', "Invalid JSON"),
        ('["0123456789abcdef-leak"]', "the file: Input should be an object"),
    ],
)
def test_a_bad_credentials_file_is_refused_naming_what_is_wrong_without_a_value(
    tmp_path: Path, text: str, named: str
) -> None:
    path = tmp_path / "credentials.json"
    path.write_text(text)
    with pytest.raises(InvalidCredentials) as refused:
        Credentials.read(path)
    assert named in str(refused.value) and "leak" not in str(refused.value)
    with pytest.raises(InvalidCredentials, match="cannot read"):
        Credentials.read(tmp_path / "missing.json")
