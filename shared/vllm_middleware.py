"""Warmplane's events from inside a vLLM server, for stacks that keep their own router: an ASGI middleware for
vLLM's OpenAI server. Light: the event contract and the emitter only (`pip install warmplane`).

    vllm serve MODEL --enable-force-include-usage \
        --middleware warmplane.shared.vllm_middleware.WarmplaneEvents

Each chat or completions request the engine answers with usage becomes a `request.observed` (and a
`prefix.missed` when its leading prefix was not cached), with the prefix chain Warmplane's gateway computes
and vLLM's own `prompt_tokens` and `cached_tokens` (`shared/request_events.py`). The first request through
a prefix carries its payload, so the planner can replay it on a new replica. Streamed answers carry usage
only when the client asks for it or the server forces it (`--enable-force-include-usage`); a stream without
usage is passed on and not observed.

The request and its answer reach the client unchanged: the middleware reads the body before vLLM does and
watches the answer go by. Publishing never blocks or fails a request: events are buffered by the emitter,
which drops (and counts) what it cannot send. A body larger than `max_body_bytes`, or one that is not a
request the chain can be computed for, is passed on unobserved. Settings are read from the server's
environment (`WARMPLANE_*`, `VllmEventSettings`) when vLLM builds its app; the emitter starts with the first
request and is flushed when the server shuts down.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec
from pydantic import Field

from warmplane.shared.emitter import Emitter
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import Event, ModelRef
from warmplane.shared.kv_blocks import DEFAULT_BLOCK_SIZE
from warmplane.shared.prefix_chain import Namespace
from warmplane.shared.request_events import (
    Observation,
    PayloadMemory,
    observed_events,
    openai_chain,
    openai_payload,
    usage_tokens,
)
from warmplane.shared.settings import EmitterSettings, WarmplaneSettings, load_settings
from warmplane.shared.topics import Topics

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

KINDS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
MAX_NAME = 128
"""The longest tenant or producer name an event carries (`events.Name`)."""
_decoder = msgspec.json.Decoder()
_USAGE = b'"usage"'
_NO_USAGE = (b'"usage":null', b'"usage": null')


class VllmEventSettings(WarmplaneSettings):
    """What the middleware reads from the vLLM server's environment (`WARMPLANE_*`), beside the broker's
    settings (`WARMPLANE_KAFKA__*`) and the event keys."""

    replica: str = Field("", max_length=MAX_NAME)
    """This engine's replica name, as its warmer announces it; empty: the host name (a pod's name)."""
    tenant: str = Field("default", min_length=1, max_length=MAX_NAME)
    """The tenant requests are counted for. With `WARMPLANE_UNSALTED_TENANTS` on the warmer it is warmed
    without a salt, as this traffic arrives."""
    tenant_header: str = ""
    """A request header naming the tenant, set by a router you trust; empty: every request is `tenant`'s."""
    model_revision: str = ""
    """The served model's revision, as its warmer announces it."""
    block_size: int = Field(DEFAULT_BLOCK_SIZE, ge=1)
    """The engine's KV block size (`--block-size`): the prefix-missed rule."""
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1)
    """Larger request bodies are passed on unobserved (answers are read only for their usage)."""
    payload_memory: int = Field(100_000, ge=0)
    """Prefix ids whose payload was sent, remembered so each is sent once (least recent forgotten)."""
    emitter: EmitterSettings = EmitterSettings(client_id="warmplane-vllm")


class Outlet(Protocol):
    """Where events go: the emitter (its `start`, `emit` and `close`); a list in unit tests."""

    async def start(self) -> None: ...

    def emit(self, event: Event) -> bool: ...

    async def close(self) -> None: ...


class WarmplaneEvents:
    """The middleware: vLLM's `--middleware` builds it with the app it wraps (settings from the environment,
    events to an `Emitter`)."""

    def __init__(
        self, app: App, settings: VllmEventSettings | None = None, outlet: Outlet | None = None
    ) -> None:
        self.app = app
        self.settings = settings if settings is not None else load_settings(VllmEventSettings)
        kafka = self.settings.kafka
        self._emitter = outlet or Emitter(kafka, self.settings.emitter, Topics(kafka.topic_prefix))
        self._started = False
        self._replica = self.settings.replica or socket.gethostname()
        self._payloads = PayloadMemory(self.settings.payload_memory)
        self.unobserved = 0
        """Answered requests no event was made for (no usage, a body too large or not understood)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._until_shutdown(receive), send)
            return
        kind = KINDS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if kind is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        if not self._started:
            self._started = True
            await self._emitter.start()  # returns at once; connects in the background
        received, body = await _read_body(receive, self.settings.max_body_bytes)
        answer = _Answer(send)
        await self.app(scope, _replay(received, receive), answer.send)
        try:
            self._observe(kind, scope, body, answer)
        except Exception:  # an observation must never fail the request it watched
            log.exception("vllm middleware: a request could not be observed")
            self.unobserved += 1

    def _until_shutdown(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message.get("type") == "lifespan.shutdown" and self._started:
                await self._emitter.close()  # flushes what is buffered, within its own bound
            return message

        return wrapped

    def _observe(self, kind: str, scope: Scope, body: bytes | None, answer: _Answer) -> None:
        counts = usage_tokens(answer.usage) if answer.status == 200 else None
        request = _request_body(body)
        if counts is None or request is None or not isinstance(request.get("model"), str):
            self.unobserved += 1
            return
        tenant = self._tenant(scope)
        if tenant is None:
            self.unobserved += 1
            return
        settings = self.settings
        chain = openai_chain(kind, request, Namespace(tenant, request["model"]))
        prompt_tokens, cached = counts
        leaf = chain.ids[-1]
        seen = Observation(
            tenant=tenant,
            model=ModelRef(request["model"], settings.model_revision),
            epoch=0,
            replica=self._replica,
            chain=chain,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            ttft_s=answer.ttft_s,
            payload=openai_payload(kind, request, leaf) if self._payloads.first_time(leaf) else None,
        )
        events = observed_events(
            seen,
            producer=f"vllm/{self._replica}"[:MAX_NAME],
            block_size=settings.block_size,
            at=datetime.now(UTC),
            new_id=new_event_id,
        )
        for event in events:
            if event is not None:
                self._emitter.emit(event)  # never blocks or raises; drops are counted by the emitter

    def _tenant(self, scope: Scope) -> str | None:
        """The request's tenant; None for a header naming one longer than an event may carry."""
        header = self.settings.tenant_header.lower().encode()
        if header:
            for name, value in scope.get("headers", ()):
                if name == header and value:
                    tenant = bytes(value).decode("latin-1")
                    return tenant if len(tenant) <= MAX_NAME else None
        return self.settings.tenant


class _Answer:
    """Watches the answer go to the client: its status, when its first body byte left, and its usage (the
    JSON body's, or a streamed usage chunk's). Only the tail of a streamed line is kept between chunks."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._started = time.monotonic()
        self.status = 0
        self.ttft_s: float | None = None
        self.usage: dict[str, Any] | None = None
        self._streaming = False
        self._whole: list[bytes] = []
        self._tail = b""
        self._usage_line = b""

    async def send(self, message: Message) -> None:
        await self._send(message)
        try:
            self._watch(message)
        except Exception:  # what the client got is what counts; a puzzling answer is just not observed
            self.usage = None

    def _watch(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            headers = dict(message.get("headers", ()))
            self._streaming = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            return
        if message["type"] != "http.response.body" or self.status != 200:
            return
        chunk: bytes = message.get("body", b"")
        if chunk and self.ttft_s is None and self._streaming:
            self.ttft_s = time.monotonic() - self._started
        if self._streaming:
            self._scan(chunk)
            if not message.get("more_body", False) and self._usage_line:
                event = _decoder.decode(self._usage_line[len(b"data: ") :])
                usage = event.get("usage") if isinstance(event, dict) else None
                self.usage = usage if isinstance(usage, dict) else None
        else:
            self._whole.append(chunk)
            if not message.get("more_body", False):
                answer = _decoder.decode(b"".join(self._whole))
                self._whole.clear()
                usage = answer.get("usage") if isinstance(answer, dict) else None
                self.usage = usage if isinstance(usage, dict) else None

    def _scan(self, chunk: bytes) -> None:
        """Keep the last event line with usage (decoded once, at the end: with vLLM's continuous usage
        statistics every chunk carries the figures so far)."""
        lines = (self._tail + chunk).split(b"\n")
        self._tail = lines.pop()
        for line in lines:
            if line.startswith(b"data: {") and _USAGE in line and not any(n in line for n in _NO_USAGE):
                self._usage_line = line


async def _read_body(receive: Receive, limit: int) -> tuple[list[Message], bytes | None]:
    """Every request message up to the body's end, and the body (None when longer than `limit`)."""
    received: list[Message] = []
    size, more = 0, True
    while more:
        message = await receive()
        received.append(message)
        if message["type"] != "http.request":
            return received, None  # the client went away: let the app see it
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
        if size > limit:
            return received, None
    return received, b"".join(m.get("body", b"") for m in received)


def _replay(received: list[Message], receive: Receive) -> Receive:
    """The messages already read, in order, then the server's own `receive` (a disconnect, or the rest of a
    body too large to keep)."""
    pending = list(received)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def _request_body(body: bytes | None) -> dict[str, Any] | None:
    if body is None:
        return None
    try:
        request = _decoder.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    return request if isinstance(request, dict) else None
