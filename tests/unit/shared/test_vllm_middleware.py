"""The middleware inside a vLLM server (`shared/vllm_middleware.py`), over a stand-in ASGI app: what it emits
from each answered request, and that the request and the answer pass through unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest

from warmplane.shared.events import Event, PrefixMissed, RequestObserved
from warmplane.shared.prefix_chain import Namespace, chat_chain, token_chain
from warmplane.shared.vllm_middleware import Message, Receive, Scope, Send, VllmEventSettings, WarmplaneEvents

MESSAGES = [{"role": "system", "content": "You are terse. " * 20}, {"role": "user", "content": "Hello there"}]
CHAT = {"model": "smol", "messages": MESSAGES, "max_tokens": 4}


class Outlet:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.started = self.closed = 0

    async def start(self) -> None:
        self.started += 1

    def emit(self, event: Event) -> bool:
        self.events.append(event)
        return True

    async def close(self) -> None:
        self.closed += 1


class Engine:
    """A stand-in for vLLM's app: records the body it read, answers with `status` and `chunks`."""

    def __init__(self, status: int = 200, chunks: list[bytes] | None = None, stream: bool = False) -> None:
        self.status, self.stream = status, stream
        self.chunks = chunks if chunks is not None else [json.dumps({"usage": usage(200, 0)}).encode()]
        self.read: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        more = True
        while more:
            message = await receive()
            self.read.append(message.get("body", b""))
            more = message.get("more_body", False)
        kind = b"text/event-stream" if self.stream else b"application/json"
        await send(
            {"type": "http.response.start", "status": self.status, "headers": [(b"content-type", kind)]}
        )
        for i, chunk in enumerate(self.chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < len(self.chunks) - 1})


def usage(prompt: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def settings(**extra: Any) -> VllmEventSettings:
    return VllmEventSettings(replica="replica-7", block_size=16, **extra)


async def call(
    middleware: WarmplaneEvents,
    body: dict[str, Any] | bytes,
    *,
    path: str = "/v1/chat/completions",
    headers: list[tuple[bytes, bytes]] | None = None,
    parts: int = 1,
) -> list[Message]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    size = -(-len(raw) // parts)
    pieces = [raw[i : i + size] for i in range(0, len(raw), size)] or [b""]
    incoming: list[Message] = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
        for i, piece in enumerate(pieces)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers or []}
    await middleware(scope, receive, send)
    return sent


async def test_an_answered_chat_becomes_its_events_with_the_gateways_chain_and_one_payload() -> None:
    engine, outlet = Engine(chunks=[json.dumps({"usage": usage(120, 16)}).encode()]), Outlet()
    middleware = WarmplaneEvents(engine, settings(), outlet)

    await call(middleware, CHAT, parts=3)
    await call(middleware, CHAT)

    assert b"".join(engine.read) == json.dumps(CHAT).encode() * 2  # the app read both bodies whole
    first, missed, second, _ = outlet.events
    assert isinstance(first, RequestObserved) and isinstance(missed, PrefixMissed)
    assert first.chain == list(chat_chain(Namespace("default", "smol"), MESSAGES).ids)
    assert (first.tenant, first.replica, first.model.name, first.epoch) == ("default", "replica-7", "smol", 0)
    assert (first.prompt_tokens, first.cached_tokens, first.chain_tokens[-1]) == (120, 16, 120)
    assert missed.resident_depth == 0  # the system prompt's blocks were not all cached
    assert first.payload is not None and first.payload.messages == MESSAGES
    assert isinstance(second, RequestObserved) and second.payload is None  # a payload goes once
    assert outlet.started == 1


async def test_a_cached_leading_prefix_is_no_miss() -> None:
    outlet = Outlet()
    middleware = WarmplaneEvents(
        Engine(chunks=[json.dumps({"usage": usage(120, 112)}).encode()]), settings(), outlet
    )
    await call(middleware, CHAT)
    [observed] = outlet.events
    assert isinstance(observed, RequestObserved) and observed.cached_tokens == 112


async def test_a_stream_is_relayed_byte_for_byte_and_observed_from_its_usage_chunk() -> None:
    usage_chunk = json.dumps({"choices": [], "usage": usage(64, 32)}).encode()
    stream = (
        b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
        + b"data: "
        + usage_chunk
        + b"\n\ndata: [DONE]\n\n"
    )
    chunks = [stream[:30], stream[30:70], stream[70:]]  # the usage line split across chunks
    outlet = Outlet()
    middleware = WarmplaneEvents(Engine(chunks=chunks, stream=True), settings(), outlet)
    body = {"model": "smol", "prompt": list(range(64)), "stream": True}

    sent = await call(middleware, body, path="/v1/completions")

    assert [m.get("body") for m in sent[1:]] == chunks
    [observed] = [e for e in outlet.events if isinstance(e, RequestObserved)]
    assert observed.chain == list(token_chain(Namespace("default", "smol"), list(range(64))).ids)
    assert (observed.prompt_tokens, observed.cached_tokens) == (64, 32)
    assert observed.ttft_ms is not None and observed.ttft_ms >= 0


async def test_a_stream_without_usage_passes_unobserved() -> None:
    outlet = Outlet()
    engine = Engine(chunks=[b'data: {"choices":[{"delta":{}}]}\n\n', b"data: [DONE]\n\n"], stream=True)
    middleware = WarmplaneEvents(engine, settings(), outlet)
    await call(middleware, {**CHAT, "stream": True})
    assert outlet.events == [] and middleware.unobserved == 1


@pytest.mark.parametrize(
    ("engine", "body", "path"),
    [
        (Engine(status=400, chunks=[b'{"error": "bad"}']), CHAT, "/v1/chat/completions"),
        (Engine(), b"{not json", "/v1/chat/completions"),
        (Engine(), {"messages": MESSAGES}, "/v1/chat/completions"),  # no model
        (Engine(), {"model": "smol", "prompt": {"x": 1}}, "/v1/completions"),  # no chain to compute
    ],
)
async def test_what_cannot_be_observed_passes_on_untouched(engine: Engine, body: Any, path: str) -> None:
    outlet = Outlet()
    middleware = WarmplaneEvents(engine, settings(), outlet)
    sent = await call(middleware, body, path=path)
    assert outlet.events == [] and middleware.unobserved == 1
    assert sent[0]["status"] == engine.status and [m["body"] for m in sent[1:]] == engine.chunks


async def test_a_body_over_the_bound_reaches_the_app_whole_and_is_not_observed() -> None:
    engine, outlet = Engine(), Outlet()
    middleware = WarmplaneEvents(engine, settings(max_body_bytes=100), outlet)
    await call(middleware, CHAT, parts=4)
    assert b"".join(engine.read) == json.dumps(CHAT).encode()
    assert outlet.events == [] and middleware.unobserved == 1


async def test_the_tenant_comes_from_the_trusted_header_only_when_one_is_named() -> None:
    outlet = Outlet()
    headers = [(b"x-tenant", b"globex")]
    await call(WarmplaneEvents(Engine(), settings(tenant_header="X-Tenant"), outlet), CHAT, headers=headers)
    await call(WarmplaneEvents(Engine(), settings(tenant="acme"), outlet), CHAT, headers=headers)
    too_long = WarmplaneEvents(Engine(), settings(tenant_header="X-Tenant"), outlet)
    await call(too_long, CHAT, headers=[(b"x-tenant", b"t" * 129)])
    tenants = [e.tenant for e in outlet.events if isinstance(e, RequestObserved)]
    assert tenants == ["globex", "acme"] and too_long.unobserved == 1


async def test_other_routes_pass_through_and_shutdown_flushes_the_emitter() -> None:
    outlet, seen = Outlet(), []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["path"] if scope["type"] == "http" else (await receive())["type"])

    middleware = WarmplaneEvents(app, settings(), outlet)
    await call(middleware, CHAT, path="/v1/models")
    await call(middleware, CHAT)  # starts the emitter

    async def shutdown() -> Message:
        return {"type": "lifespan.shutdown"}

    async def ignore(message: Message) -> None:
        return None

    await middleware({"type": "lifespan"}, shutdown, ignore)
    assert seen == ["/v1/models", "/v1/chat/completions", "lifespan.shutdown"]
    assert (outlet.started, outlet.closed) == (1, 1)


async def test_continuous_usage_in_every_chunk_makes_one_observation() -> None:
    """`--enable-force-include-usage`: vLLM puts the figures so far in every chunk; one event comes of it."""
    lines = [
        json.dumps(
            {"choices": [{"delta": {"content": "x"}}], "usage": usage(64, 32) | {"completion_tokens": i}}
        )
        for i in range(1, 4)
    ]
    stream = "".join(f"data: {line}\n\n" for line in lines).encode() + b"data: [DONE]\n\n"
    outlet = Outlet()
    middleware = WarmplaneEvents(Engine(chunks=[stream[:50], stream[50:]], stream=True), settings(), outlet)
    await call(middleware, {**CHAT, "stream": True})
    [observed] = [e for e in outlet.events if isinstance(e, RequestObserved)]
    assert (observed.prompt_tokens, observed.cached_tokens) == (64, 32)
