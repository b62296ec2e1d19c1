"""A replica's streamed answer relayed to the client, with one guaranteed ending.

`RelayedStream` is the Starlette response of a stream: it forwards what `SseRelay` lets through, and
ends exactly once, whichever way the stream ends: `complete` (the replica finished and every byte went
out), `broken` (the replica failed mid-stream: the client gets one final SSE error event, then the end)
or `abandoned` (the client went away, or the response was never started). `on_end(outcome, ttft_s)` is
then called, before the upstream connection is closed, so counts and in-flight loads never leak.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Literal

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from warmplane.services.gateway.errors import upstream_failed
from warmplane.services.gateway.sse_relay import SseRelay
from warmplane.services.gateway.upstream import UpstreamBroken, UpstreamResponse, UpstreamTimeout

Outcome = Literal["complete", "broken", "abandoned"]


class RelayedStream(StreamingResponse):
    """`started` and `monotonic()` are in the same clock: `ttft_s` is the first byte out minus `started`."""

    def __init__(
        self,
        upstream: UpstreamResponse,
        relay: SseRelay,
        *,
        started: float,
        monotonic: Callable[[], float],
        on_end: Callable[[Outcome, float | None], None],
        headers: dict[str, str],
    ) -> None:
        self._upstream = upstream
        self._relay = relay
        self._started = started
        self._monotonic = monotonic
        self._on_end = on_end
        self._outcome: Outcome = "abandoned"
        self._ended = False
        self.ttft_s: float | None = None
        media_type = upstream.content_type or "text/event-stream"
        super().__init__(self._chunks(), headers=headers, media_type=media_type)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        spec = tuple(int(part) for part in scope.get("asgi", {}).get("spec_version", "2.0").split("."))
        try:
            if spec >= (2, 4):  # the server raises OSError when a send finds the client gone
                await super().__call__(scope, receive, send)
            else:
                await self._stream_watched(receive, send)
        finally:
            await self._end()

    async def _stream_watched(self, receive: Receive, send: Send) -> None:
        """Streams in this task while a watcher task waits for the client's disconnect, then cancels
        the stream. Starlette's own (an anyio task group, the stream in a second task) cost the first
        byte a task start and a loop step, and a streamed request about 200 us more in-process
        (`python -m bench.gateway_profile app --stream`: 300 us a request against 500-540)."""
        streaming = asyncio.current_task()
        assert streaming is not None
        state = {"done": False, "gone": False}

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not state["done"]:
                state["gone"] = True
                streaming.cancel()

        watcher = asyncio.create_task(watch())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not state["gone"]:
                raise
            streaming.uncancel()
        finally:
            state["done"] = True
            watcher.cancel()

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._upstream.iter_raw():
                out = self._relay.feed(chunk)
                if out:
                    if self.ttft_s is None:
                        self.ttft_s = self._monotonic() - self._started
                    yield out
            rest = self._relay.finish()
            if rest:
                yield rest
            self._outcome = "complete"
        except (UpstreamBroken, UpstreamTimeout) as exc:
            self._outcome = "broken"
            yield upstream_failed(f"the stream broke off ({exc})").sse_event()
        finally:
            await self._end()

    async def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._on_end(self._outcome, self.ttft_s)
        await self._upstream.close()
