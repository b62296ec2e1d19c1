"""The gateway's serving path with no sockets: the app through httpx's ASGI transport, the replicas as
an in-memory `Upstream`. Routing, salts, error shapes, pass-through, failover, events and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from starlette.requests import ClientDisconnect

from warmplane.services.gateway.app import GatewayParts, bootstrap
from warmplane.services.gateway.membership import Replica, ReplicaTable, static_membership
from warmplane.services.gateway.relayed_stream import RelayedStream
from warmplane.services.gateway.settings import GatewayOptions, GatewaySettings, RoutingSettings
from warmplane.services.gateway.sse_relay import SseRelay
from warmplane.services.gateway.upstream import UpstreamBroken, UpstreamTimeout, UpstreamUnreachable
from warmplane.shared.cache_salt import derive_cache_salt
from warmplane.shared.events import Event, PrefixMissed, RequestObserved

KEYS = {"acme": "sk-acme-secret-key", "globex": "sk-globex-secret-key"}
SECRETS = {"acme": "acme-salt-secret", "globex": "globex-salt-secret"}
MODEL = "tiny"
SSE = "text/event-stream; charset=utf-8"


class ListSink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> bool:
        self.events.append(event)
        return True

    def of(self, cls: type[Event]) -> list[Any]:
        return [event for event in self.events if isinstance(event, cls)]


class Answer:
    """A replica's answer: a status, a content type and a body in `chunks`, then broken off with
    `error` if given (the `UpstreamResponse` the proxy reads)."""

    def __init__(
        self,
        status: int,
        chunks: list[bytes],
        *,
        content_type: str | None = "application/json",
        error: Exception | None = None,
    ) -> None:
        self.status = status
        self.content_type = content_type
        self.resent = False
        self.chunks = chunks
        self.error = error
        self.closed = False

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_raw()])

    async def iter_raw(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.error is not None:
            raise self.error

    async def close(self) -> None:
        self.closed = True


def json_answer(status: int, body: object) -> Answer:
    return Answer(status, [json.dumps(body).encode()])


def usage(prompt: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def sse(*chunks: dict[str, Any]) -> list[bytes]:
    return [b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks] + [b"data: [DONE]\n\n"]


@dataclass
class Fleet:
    """Replicas r0, r1, r2 in memory: what each received, and how each answers (`answer(replica, body)`,
    which may raise the upstream errors instead)."""

    answer: Callable[[str, dict[str, Any]], Answer]
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def post(self, url: str, body: bytes) -> Answer:
        replica = url.removeprefix("http://").split(".")[0]
        sent = json.loads(body)
        self.received.append((replica, sent))
        return self.answer(replica, sent)

    async def close(self) -> None:
        pass


def completion(replica: str, body: dict[str, Any], *, prompt: int = 200, cached: int = 0) -> Answer:
    if body.get("stream"):
        chunks = sse(
            {"id": "c1", "choices": [{"index": 0, "text": "hi"}]},
            {"id": "c1", "choices": [], "usage": usage(prompt, cached)},
        )
        return Answer(200, chunks, content_type=SSE)
    return json_answer(200, {"id": "c1", "choices": [{"text": "hi"}], "usage": usage(prompt, cached)})


@dataclass
class Harness:
    client: httpx.AsyncClient
    parts: GatewayParts
    fleet: Fleet
    sink: ListSink
    table: ReplicaTable

    async def metrics(self) -> str:
        """The Prometheus text of the metrics port's app (`/metrics` is not on the clients' port)."""
        transport = httpx.ASGITransport(app=self.parts.metrics_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway-metrics") as client:
            return (await client.get("/metrics")).text

    async def post(self, body: dict[str, Any], *, tenant: str = "acme", path: str = "/v1/completions") -> Any:
        headers = {"authorization": f"Bearer {KEYS[tenant]}"}
        return await self.client.post(path, json=body, headers=headers)


@contextlib.asynccontextmanager
async def serving(routing: RoutingSettings, options: GatewayOptions | None = None) -> AsyncIterator[Harness]:
    """The gateway over mock replicas r0, r1, r2 of `MODEL`, all ready."""
    fleet = Fleet(completion)
    sink = ListSink()
    settings = GatewaySettings(
        tenant_keys={tenant: [SecretStr(key)] for tenant, key in KEYS.items()},
        tenant_secrets={tenant: SecretStr(secret) for tenant, secret in SECRETS.items()},
        gateway=options or GatewayOptions(block_size=32, max_body_bytes=8192),
        routing=routing,
    )
    table = static_membership(Replica(f"r{i}", f"http://r{i}.test:8000", MODEL, "rev1") for i in range(3))
    parts = bootstrap(settings, membership=table, sink=sink, client=fleet)
    app = httpx.AsyncClient(transport=httpx.ASGITransport(app=parts.app), base_url="http://gateway")
    async with app:
        yield Harness(app, parts, fleet, sink, table)


@pytest.fixture
async def gateway() -> AsyncIterator[Harness]:
    async with serving(RoutingSettings(ramp_s=0)) as harness:
        yield harness


def prompt(i: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": f"system prompt number {i} " * 40 + "question", "max_tokens": 1}


async def test_the_same_prefix_always_lands_on_the_same_replica_and_prefixes_spread(gateway: Harness) -> None:
    served: dict[int, set[str]] = {}
    for i in range(30):
        for _ in range(3):
            response = await gateway.post(prompt(i))
            assert response.status_code == 200
            served.setdefault(i, set()).add(response.headers["x-warmplane-replica"])
    assert all(len(replicas) == 1 for replicas in served.values())
    assert set().union(*served.values()) == {"r0", "r1", "r2"}


async def test_the_tenant_salt_and_priority_override_the_clients(gateway: Harness) -> None:
    body = {**prompt(1), "cache_salt": "chosen-by-client", "priority": -100}
    await gateway.post(body, tenant="acme")
    await gateway.post(body, tenant="globex")
    gateway.parts.epochs.bump("acme", MODEL, 3)
    await gateway.post(body, tenant="acme")
    salts = [sent["cache_salt"] for _, sent in gateway.fleet.received]
    assert salts == [
        derive_cache_salt(SecretStr(SECRETS["acme"]), "acme", MODEL, 0),
        derive_cache_salt(SecretStr(SECRETS["globex"]), "globex", MODEL, 0),
        derive_cache_salt(SecretStr(SECRETS["acme"]), "acme", MODEL, 3),
    ]
    assert len(set(salts)) == 3
    assert {sent["priority"] for _, sent in gateway.fleet.received} == {0}
    assert [event.epoch for event in gateway.sink.of(RequestObserved)] == [0, 0, 3]


ACME = "Bearer sk-acme-secret-key"
BAD_INPUT = [
    (b'{"model": "tiny", "prompt": ', ACME, (400, "invalid_json", None)),
    (b"[1, 2]", ACME, (400, "invalid_json", None)),
    (b'{"prompt": "x"}', ACME, (400, "invalid_request", "model")),
    (b'{"model": "tiny"}', ACME, (400, "invalid_request", "prompt")),
    (b'{"model": "tiny", "prompt": [1, "a"]}', ACME, (400, "invalid_request", "prompt")),
    (b'{"model": "tiny", "prompt": "x", "stream": "yes"}', ACME, (400, "invalid_request", "stream")),
    (b'{"model": "gpt-9", "prompt": "x"}', ACME, (404, "model_not_found", "model")),
    (b'{"model": "tiny", "prompt": "x"}', None, (401, "missing_api_key", None)),
    (b'{"model": "tiny", "prompt": "x"}', "Bearer sk-wrong", (401, "invalid_api_key", None)),
    (b'{"model": "tiny", "prompt": "x"}', "Basic sk-acme-secret-key", (401, "invalid_api_key", None)),
    (b'{"model": "tiny", "prompt": "' + b"x" * 9000 + b'"}', ACME, (413, "request_too_large", None)),
]


@pytest.mark.parametrize(("raw", "authorization", "expected"), BAD_INPUT)
async def test_bad_input_gets_an_openai_error_that_says_what_is_wrong_and_reaches_no_replica(
    gateway: Harness, raw: bytes, authorization: str | None, expected: tuple[int, str, str | None]
) -> None:
    headers = {"content-type": "application/json"}
    if authorization is not None:
        headers["authorization"] = authorization
    response = await gateway.client.post("/v1/completions", content=raw, headers=headers)
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (response.status_code, error["code"], error["param"]) == expected
    assert error["message"].endswith(".") and "sk-" not in error["message"]
    assert gateway.fleet.received == []


async def test_chat_without_messages_and_unknown_paths_are_refused_in_the_openai_shape(
    gateway: Harness,
) -> None:
    response = await gateway.post({"model": MODEL, "messages": []}, path="/v1/chat/completions")
    assert (response.status_code, response.json()["error"]["param"]) == (400, "messages")
    response = await gateway.client.get("/v1/completions")
    assert (response.status_code, response.json()["error"]["code"]) == (405, "http_405")
    response = await gateway.client.get("/v2/anything")
    assert (response.status_code, response.json()["error"]["code"]) == (404, "http_404")


async def test_no_ready_replica_is_a_503_and_models_lists_what_is_served(gateway: Harness) -> None:
    for name in ("r0", "r1", "r2"):
        gateway.table.eject(name, until=2e9 * 10)
    response = await gateway.post(prompt(1))
    assert (response.status_code, response.json()["error"]["code"]) == (503, "no_ready_replica")
    models = await gateway.client.get("/v1/models", headers={"authorization": f"Bearer {KEYS['acme']}"})
    assert [entry["id"] for entry in models.json()["data"]] == [MODEL]
    assert (await gateway.client.get("/v1/models")).status_code == 401


async def test_a_replicas_error_status_and_body_pass_through_untouched(gateway: Harness) -> None:
    body = b'{"error":{"message":"max_tokens is too large","type":"BadRequestError","param":null,"code":400}}'
    gateway.fleet.answer = lambda replica, sent: Answer(400, [body])
    response = await gateway.post(prompt(1))
    assert (response.status_code, response.content) == (400, body)
    assert gateway.sink.events == []


async def test_a_connection_failure_moves_to_the_next_replica_and_ejects_the_dead_one(
    gateway: Harness,
) -> None:
    owner = (await gateway.post(prompt(7))).headers["x-warmplane-replica"]

    def refuse_owner(replica: str, sent: dict[str, Any]) -> Answer:
        if replica == owner:
            raise UpstreamUnreachable("ClientConnectorError")
        return completion(replica, sent)

    gateway.fleet.answer = refuse_owner
    gateway.fleet.received.clear()
    first = await gateway.post(prompt(7))
    second = await gateway.post(prompt(7))
    assert first.status_code == second.status_code == 200
    assert first.headers["x-warmplane-replica"] == second.headers["x-warmplane-replica"] != owner
    # The dead owner was tried once, then left out of the ring: the second request went straight on.
    assert [replica for replica, _ in gateway.fleet.received].count(owner) == 1
    assert gateway.sink.of(RequestObserved)[-2].route == "failover"
    assert gateway.sink.of(RequestObserved)[-1].route == "ring"


async def test_a_failure_after_the_request_was_sent_is_answered_not_retried(gateway: Harness) -> None:
    def hang_up(replica: str, sent: dict[str, Any]) -> Answer:
        raise UpstreamBroken("ServerDisconnectedError")

    gateway.fleet.answer = hang_up
    response = await gateway.post(prompt(3))
    assert (response.status_code, response.json()["error"]["code"]) == (502, "upstream_error")
    assert len(gateway.fleet.received) == 1
    assert gateway.parts.router.in_flight == {}


async def test_a_request_the_client_resent_is_served_counted_and_its_replica_kept(gateway: Harness) -> None:
    def resent(replica: str, sent: dict[str, Any]) -> Answer:
        answer = completion(replica, sent)
        answer.resent = True
        return answer

    gateway.fleet.answer = resent
    first = await gateway.post(prompt(5))
    second = await gateway.post(prompt(5))
    assert first.status_code == second.status_code == 200
    replica = first.headers["x-warmplane-replica"]
    assert second.headers["x-warmplane-replica"] == replica  # not ejected: the replica answered
    text = await gateway.metrics()
    assert f'warmplane_gateway_resends_total{{replica="{replica}"}} 2.0' in text
    assert "warmplane_gateway_ejections_total{" not in text


async def test_a_stream_passes_through_byte_for_byte_without_the_usage_chunk_it_did_not_ask_for(
    gateway: Harness,
) -> None:
    chunks = sse(
        {"id": "c1", "choices": [{"index": 0, "text": "a"}]},
        {"id": "c1", "choices": [{"index": 0, "text": "b"}]},
        {"id": "c1", "choices": [], "usage": usage(200, 64)},
    )
    gateway.fleet.answer = lambda replica, sent: Answer(
        200, [b"".join(chunks)[i : i + 10] for i in range(0, 999, 10)], content_type=SSE
    )
    plain = await gateway.post({**prompt(2), "stream": True})
    assert plain.headers["content-type"] == SSE
    assert plain.content == chunks[0] + chunks[1] + chunks[3]
    asked = await gateway.post({**prompt(2), "stream": True, "stream_options": {"include_usage": True}})
    assert asked.content == b"".join(chunks)
    assert all(sent["stream_options"] == {"include_usage": True} for _, sent in gateway.fleet.received)
    observed = gateway.sink.of(RequestObserved)
    assert [(event.prompt_tokens, event.cached_tokens) for event in observed] == [(200, 64), (200, 64)]
    assert all(event.ttft_ms is not None and event.ttft_ms >= 0 for event in observed)


async def test_a_stream_that_breaks_ends_with_an_error_event_and_its_replica_leaves_the_ring(
    gateway: Harness,
) -> None:
    owner = (await gateway.post(prompt(4))).headers["x-warmplane-replica"]
    first = sse({"id": "c1", "choices": [{"index": 0, "text": "a"}]})[0]
    gateway.fleet.answer = lambda replica, sent: Answer(
        200, [first], content_type=SSE, error=UpstreamBroken("ClientPayloadError")
    )
    broken = await gateway.post({**prompt(4), "stream": True})
    assert broken.status_code == 200
    assert broken.content.startswith(first)
    error = json.loads(broken.content[len(first) :].removeprefix(b"data: "))["error"]
    assert error["code"] == "upstream_error"
    assert owner not in [r.name for r in gateway.table.ready(MODEL, datetime.now(UTC).timestamp())]
    assert gateway.parts.router.in_flight == {}
    assert len(gateway.sink.of(RequestObserved)) == 1  # no usage, no observation for the broken one


async def test_request_observed_carries_the_chain_usage_and_where_it_was_served(gateway: Harness) -> None:
    messages = [{"role": "system", "content": "You are terse. " * 40}, {"role": "user", "content": "Hi?"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 1}
    gateway.fleet.answer = lambda replica, sent: completion(replica, sent, prompt=180, cached=160)
    first = await gateway.post(body, path="/v1/chat/completions")
    await gateway.post(body, path="/v1/chat/completions")
    one, two = gateway.sink.of(RequestObserved)
    assert (one.tenant, one.model.name, one.model.revision, one.epoch) == ("acme", MODEL, "rev1", 0)
    assert one.replica == first.headers["x-warmplane-replica"]
    assert len(one.chain) == 2 and one.chain_tokens[-1] == one.prompt_tokens == 180
    assert one.cached_tokens == 160 and one.ttft_ms is None
    assert (
        one.payload is not None
        and one.payload.messages == messages
        and one.payload.prefix_id == one.chain[-1]
    )
    assert two.chain == one.chain and two.payload is None  # the payload goes once
    assert gateway.sink.of(PrefixMissed) == []


async def test_a_request_whose_leading_prefix_was_not_cached_is_a_prefix_miss(gateway: Harness) -> None:
    gateway.fleet.answer = lambda replica, sent: completion(replica, sent, prompt=400, cached=0)
    messages = [{"role": "system", "content": "Long rules. " * 80}, {"role": "user", "content": "Hi?"}]
    await gateway.post({"model": MODEL, "messages": messages}, path="/v1/chat/completions")
    [miss] = gateway.sink.of(PrefixMissed)
    [seen] = gateway.sink.of(RequestObserved)
    assert (miss.chain, miss.resident_depth, miss.cached_tokens) == (seen.chain, 0, 0)
    assert miss.tenant == "acme" and miss.replica == seen.replica
    metrics = await gateway.metrics()
    assert 'warmplane_gateway_cold_requests_total{model="tiny",tenant="acme"} 1.0' in metrics


async def test_metrics_count_by_tenant_and_model_and_never_show_a_key(
    gateway: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    gateway.fleet.answer = lambda replica, sent: completion(replica, sent, prompt=100, cached=64)
    await gateway.post(prompt(1))
    await gateway.client.post(
        "/v1/completions", json=prompt(1), headers={"authorization": "Bearer sk-nobody"}
    )
    text = await gateway.metrics()
    assert (
        'warmplane_gateway_requests_total{endpoint="completions",model="tiny",status="200",tenant="acme"} 1.0'
        in text
    )
    assert 'warmplane_gateway_errors_total{code="invalid_api_key",model="-",tenant="-"} 1.0' in text
    assert 'warmplane_gateway_cached_tokens_total{model="tiny",tenant="acme"} 64.0' in text
    assert 'warmplane_gateway_prompt_tokens_total{model="tiny",tenant="acme"} 100.0' in text
    for secret in (*KEYS.values(), *SECRETS.values(), "sk-nobody"):
        assert secret not in text and secret not in caplog.text


def test_settings_refuse_keys_without_a_salt_secret_and_a_key_shared_by_tenants() -> None:
    with pytest.raises(ValueError, match="no cache-salt secret"):
        GatewaySettings(tenant_keys={"acme": [SecretStr(KEYS["acme"])]}, tenant_secrets={})
    with pytest.raises(ValueError, match="one tenant each"):
        GatewaySettings(
            tenant_keys={"a": [SecretStr(KEYS["acme"])], "b": [SecretStr(KEYS["acme"])]},
            tenant_secrets={"a": SecretStr("s"), "b": SecretStr("s")},
        )
    settings = GatewaySettings(
        tenant_keys={"a": [SecretStr("key-a-0123456789")]}, tenant_secrets={"a": SecretStr("salt-a")}
    )
    assert "key-a" not in repr(settings) and "salt-a" not in repr(settings)


def relayed(upstream: Answer, ends: list[tuple[str, float | None]]) -> RelayedStream:
    """`upstream` relayed to the client, half a second after it started; each end goes to `ends`."""
    return RelayedStream(
        upstream,
        SseRelay(strip_usage_chunk=True),
        started=0.0,
        monotonic=lambda: 0.5,
        on_end=lambda outcome, ttft: ends.append((outcome, ttft)),
        headers={},
    )


async def test_a_stream_the_client_abandons_ends_once_and_releases_its_replica() -> None:
    chunks = sse({"id": "c1", "choices": [{"index": 0, "text": "a"}]})
    upstream = Answer(200, chunks, content_type=SSE)
    ends: list[tuple[str, float | None]] = []
    stream = relayed(upstream, ends)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def gone(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body":
            raise OSError("the client went away")

    scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "method": "POST", "path": "/", "headers": []}
    with pytest.raises((OSError, ClientDisconnect)):
        await stream(scope, receive, gone)
    assert ends == [("abandoned", 0.5)]
    assert upstream.closed


class Stalling(Answer):
    """A replica that sends its chunks, then goes silent (until the stream is cancelled)."""

    async def iter_raw(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        await asyncio.Event().wait()


@pytest.mark.parametrize("client_leaves", [True, False])
async def test_on_an_asgi_2_3_server_a_stream_ends_when_the_client_leaves_or_the_replica_finishes(
    client_leaves: bool,
) -> None:
    chunks = sse({"id": "c1", "choices": [{"index": 0, "text": "a"}]})
    upstream = (Stalling if client_leaves else Answer)(200, chunks[:1] if client_leaves else chunks)
    ends: list[tuple[str, float | None]] = []
    stream = relayed(upstream, ends)
    first_chunk_sent = asyncio.Event()
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        await first_chunk_sent.wait()  # as uvicorn: the client's disconnect, once it happens
        if not client_leaves:
            await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])
            first_chunk_sent.set()

    scope = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "POST", "path": "/", "headers": []}
    await asyncio.wait_for(stream(scope, receive, send), 5)
    assert ends == [("abandoned" if client_leaves else "complete", 0.5)]
    assert upstream.closed
    assert sent[0] == chunks[0]


async def test_with_routing_depth_one_a_shared_system_prompt_spreads_by_the_next_message() -> None:
    system = {"role": "system", "content": "One system prompt for everyone. " * 20}
    served: dict[int, set[str]] = {}
    async with serving(RoutingSettings(ramp_s=0, depth=1)) as gateway:
        for i in range(20):
            body = {"model": MODEL, "messages": [system, {"role": "user", "content": f"question {i}"}]}
            for _ in range(2):
                response = await gateway.post(body, path="/v1/chat/completions")
                served.setdefault(i, set()).add(response.headers["x-warmplane-replica"])
    assert all(len(replicas) == 1 for replicas in served.values())
    assert len(set().union(*served.values())) > 1


async def test_a_replica_that_does_not_answer_in_time_is_a_504_and_stays_in_the_ring(
    gateway: Harness,
) -> None:
    def stall(replica: str, sent: dict[str, Any]) -> Answer:
        raise UpstreamTimeout("SocketTimeoutError")

    gateway.fleet.answer = stall
    response = await gateway.post(prompt(5))
    assert (response.status_code, response.json()["error"]["code"]) == (504, "upstream_timeout")
    assert len(gateway.table.ready(MODEL, datetime.now(UTC).timestamp())) == 3
