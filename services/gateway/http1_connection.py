"""One HTTP/1.1 client connection to a replica: an asyncio Protocol whose answers httptools parses.

`Http1Connection` writes a request and collects its answer as it arrives: the status and
Content-Type once the head is parsed, then the de-chunked body, buffered until the reader `take()`s it.
It knows whether it may carry another request (`reusable`); the pool (`httptools_upstream.py`) decides
what to do with it.

Invariants:
- `wait()` returns when the answer moved on (its head, body bytes, its end) or failed; a failure is
  kept and `raise_failure()` raises it: `UpstreamTimeout` after `read_timeout_s` without a byte (each
  wait has its own bound, and every byte ends a wait), `UpstreamBroken` when the replica closed the
  connection before the answer ended or sent what httptools cannot parse (`UpstreamClosed` when it
  closed it before a byte of the answer, or it was closing when the request went out). A failure or a
  cancelled wait aborts the connection: an answer left halfway is never read again.
- More than `buffer_bytes` of body taken from the socket but not by the reader pauses reading from
  the socket; `take()` resumes it.
- Bytes that arrive while no request is out, or past the end of an answer, close the connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import httptools

from warmplane.services.gateway.upstream import UpstreamBroken, UpstreamClosed, UpstreamTimeout

Key = tuple[str, int]


class Http1Connection(asyncio.Protocol):
    """`on_lost(self)` is called once the connection is gone, whoever closed it."""

    def __init__(
        self,
        key: Key,
        *,
        read_timeout_s: float,
        buffer_bytes: int,
        on_lost: Callable[[Http1Connection], None],
    ) -> None:
        self.key = key
        self._loop = asyncio.get_running_loop()
        self._read_timeout_s = read_timeout_s
        self._buffer_bytes = buffer_bytes
        self._on_lost = on_lost
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = self._loop.create_future()
        self.pooled = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False
        self._asked = False
        self._heard = False  # a byte arrived since the request went out
        self.error: UpstreamBroken | UpstreamTimeout | None = None
        self._begin_answer()

    def _begin_answer(self) -> None:
        self.status = 0
        self.content_type: str | None = None
        self.headed = False
        self.complete = False
        self._keep_alive = False
        self._delimited = False  # Content-Length or chunked: the end is in the stream, not at its close
        self._chunks: list[bytes] = []
        self._buffered = 0

    @property
    def transport(self) -> asyncio.Transport:
        assert self._transport is not None, "used before the connection was made"
        return self._transport

    @property
    def reusable(self) -> bool:
        """The last answer arrived whole, over HTTP/1.1 keep-alive, and nothing has gone wrong since."""
        return self.complete and self._keep_alive and self.error is None and not self.transport.is_closing()

    def send(self, request: bytes) -> None:
        """Write one request (a single write); its answer starts afresh."""
        self._begin_answer()
        self._asked = True
        self._heard = False
        if self.transport.is_closing():
            self._fail(UpstreamClosed("the connection was closing"))
            return
        self.transport.write(request)

    def park(self) -> None:
        """Idle between requests: an unread body is dropped, and the socket read again (to see EOF)."""
        self._asked = False
        self._chunks = []
        self._buffered = 0
        self._resume()

    def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def take(self) -> bytes:
        """The body received since the last `take()` (b"" if none)."""
        chunks = self._chunks
        if not chunks:
            return b""
        self._chunks = []
        self._buffered = 0
        self._resume()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def wait(self) -> None:
        """Until the answer moves on: its head, body bytes, its end, or a failure (see `raise_failure`)."""
        waiter = self._waiter = self._loop.create_future()
        self._timer = self._loop.call_later(self._read_timeout_s, self._time_out)
        try:
            await waiter
        except asyncio.CancelledError:
            self._fail(UpstreamBroken("the wait was cancelled"))
            raise
        finally:
            self._waiter = None
            self._timer.cancel()

    def raise_failure(self) -> None:
        """Raises what went wrong with this connection, if anything did."""
        if self.error is not None:
            raise self.error

    def _time_out(self) -> None:
        self._fail(UpstreamTimeout(f"no byte for {self._read_timeout_s:g} s"))

    def _fail(self, error: UpstreamBroken | UpstreamTimeout) -> None:
        if self.error is None:
            self.error = error
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _resume(self) -> None:
        if self._paused:
            self._paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self._asked or self.complete:
            self.transport.close()  # bytes nobody asked for: the connection is not trusted again
            return
        self._heard = True
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._unparsable(exc)
        self._wake()

    def _unparsable(self, exc: Exception) -> None:
        if self.complete:  # bytes past a whole answer: that answer stands, the connection goes
            self.transport.close()
        else:
            self._fail(UpstreamBroken(f"unparsable HTTP ({exc or type(exc).__name__})"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._asked and not self.complete:
            if self.headed and not self._delimited and exc is None:
                self.complete = True  # an answer delimited by the connection's close (HTTP/1.0 style)
            elif self._heard:
                stage = "mid-answer" if self.headed else "before answering"
                self._fail(UpstreamBroken(f"the replica closed the connection {stage}"))
            else:
                self._fail(UpstreamClosed("the replica closed the connection before answering"))
        self._wake()
        if not self.lost.done():
            self.lost.set_result(None)
        self._on_lost(self)

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self.complete:
            raise UpstreamBroken("a second answer to one request")

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.content_type = value.decode("latin-1")
        elif name == b"content-length" or (
            name == b"transfer-encoding" and value.rstrip().lower().endswith(b"chunked")
        ):
            self._delimited = True

    def on_headers_complete(self) -> None:
        parser = self._parser
        self.status = parser.get_status_code()
        self._keep_alive = parser.should_keep_alive() and parser.get_http_version() == "1.1"
        self.headed = True

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > self._buffer_bytes and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.status < 200:  # an interim answer (100 Continue, 103 Early Hints): the real one follows
            self._begin_answer()
            return
        self.complete = True
