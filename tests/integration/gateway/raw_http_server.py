"""A raw HTTP/1.1 server for the upstream client's tests: it reads requests and lets the test answer
each as it likes (or not at all), and tells when each connection ended; and the bytes of answers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from bench.raw_http import content_length


@dataclass
class Exchange:
    """One request as the server read it: the `number`-th request, on the `connection`-th accepted
    connection (both from 0)."""

    number: int
    connection: int
    head: bytes
    body: bytes
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def until_client_closes(self) -> None:
        """Answers nothing more; returns once the client closed the connection (or sent more)."""
        with contextlib.suppress(ConnectionError):
            await self.reader.read(1)


Handler = Callable[[Exchange], Awaitable[None]]


class RawHttpServer:
    """Reads requests (head, then Content-Length bytes) and lets `handler` answer each as it likes.
    `ended[i]` is set once the i-th connection is closed, by either side."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.exchanges: list[Exchange] = []
        self.ended: list[asyncio.Event] = []
        self.url = ""
        self.listener: asyncio.Server | None = None

    @property
    def connections(self) -> int:
        return len(self.ended)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = len(self.ended)
        ended = asyncio.Event()
        self.ended.append(ended)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                body = await reader.readexactly(content_length(head))
                exchange = Exchange(len(self.exchanges), index, head, body, reader, writer)
                self.exchanges.append(exchange)
                await self.handler(exchange)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            ended.set()


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[RawHttpServer]:
    server = RawHttpServer(handler)
    listener = server.listener = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    server.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    try:
        yield server
    finally:
        listener.close()


def whole(body: bytes, *, status_line: bytes = b"HTTP/1.1 200 OK", headers: bytes = b"") -> bytes:
    length = b"Content-Length: %d\r\n" % len(body)
    return status_line + b"\r\nContent-Type: application/json\r\n" + length + headers + b"\r\n" + body


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.005)


async def ended(server: RawHttpServer, connection: int) -> None:
    """Until the server saw `connection` close (the client closed it: these servers never do)."""
    async with asyncio.timeout(5):
        await server.ended[connection].wait()
