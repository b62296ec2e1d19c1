"""Serving an ASGI app with uvicorn inside the running event loop, on a socket bound before it starts.

Binding first means port 0 gets a free port that is known (`port`) before anyone probes it. The
socket is made with `IPPROTO_TCP`, not the default 0: asyncio sets TCP_NODELAY only on accepted
sockets whose protocol says TCP, and without it Nagle held each response's body behind its headers
for a delayed ACK (measured: 44 ms on every request).

`coalesce_writes=True` (the gateway) sends a response's head and its first body bytes in one write:
uvicorn writes them apart, and on loopback each write wakes the client once more (on 2 cores about a
tenth of the gateway's busy time went to the head's own write). A write is held until the next one
or the end of the current event-loop step, whichever comes first, so nothing waits longer than that.

uvicorn's `Server.serve` replaces the process's SIGINT and SIGTERM handlers while it runs, stops itself
on either and raises the signal again when it is done, which ends the process before its own clean-up
(closing pools, flushing producers) has run. Every service here handles its signals itself and stops its
servers in order, so the servers leave the process's handlers as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class AsgiServer:
    """`app` on `host:port`; `start` returns once it accepts connections, `stop` waits at most
    `stop_timeout_s` for requests in flight."""

    def __init__(
        self,
        app: ASGIApp,
        host: str,
        port: int,
        *,
        name: str,
        stop_timeout_s: float = 5.0,
        coalesce_writes: bool = False,
    ) -> None:
        self._app = app
        self._http: type[asyncio.Protocol] | str = _CoalescingHttpTools if coalesce_writes else "auto"
        self._host = host
        self._port = port
        self._name = name
        self._stop_timeout_s = stop_timeout_s
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None

    @property
    def port(self) -> int:
        if self._socket is None:
            raise RuntimeError(f"the {self._name} server is not started")
        port: int = self._socket.getsockname()[1]
        return port

    async def start(self) -> None:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        self._socket = sock
        config = uvicorn.Config(
            self._app, http=self._http, log_level="warning", access_log=False, lifespan="off"
        )
        server = self._server = _SignallessServer(config)
        task = self._task = asyncio.create_task(server.serve(sockets=[sock]), name=f"{self._name} http")
        while not server.started:
            if task.done():
                await task  # raises what stopped it
                raise RuntimeError(f"the {self._name} server stopped while starting")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            # Not `wait_for` under a suppressed CancelledError: that also swallowed a cancellation of
            # the caller (and on 3.11 `wait_for` can lose one by itself, gh-86296).
            done, _ = await asyncio.wait({self._task}, timeout=self._stop_timeout_s)
            if not done:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
            elif not self._task.cancelled():
                self._task.result()  # a server that failed says so
        if self._socket is not None:
            self._socket.close()


class _SignallessServer(uvicorn.Server):
    """uvicorn's server, leaving the process's signal handlers as they are."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _HeldWrites:
    """`transport`, except that a write waits for the next one (then both go as one) or for the end
    of the loop step; `close()` sends what is held first."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is None:
            self._held = bytes(data)
            self._loop.call_soon(self._release)
        else:
            held, self._held = self._held, None
            self._transport.write(held + data)

    def _release(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._release()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _CoalescingHttpTools(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_HeldWrites(transport, self.loop))  # type: ignore[arg-type]
