"""`HttpToolsUpstream`: the gateway's `Upstream`, pooled HTTP/1.1 keep-alive connections on asyncio
Protocols, answers parsed by httptools (the C parser uvicorn serves the gateway's own requests with).

Why this client and not aiohttp's: see `upstream.py` (about a fifth of the client CPU per request).

Contracts, beyond `upstream.Upstream`'s:
- A request is one write: `POST <path> HTTP/1.1`, Host, `Content-Type: application/json`,
  Content-Length, the body.
- Idle connections are pooled per (host, port) and reused newest first; there is no limit on
  connections. A connection idle `keepalive_s` or longer is closed, never reused (keep it under the
  replicas' own idle timeout: vLLM's uvicorn closes idle connections after 5 s); one the replica closed
  while idle leaves the pool at once. A connection returns to the pool only on `close()` after an answer
  that arrived whole over HTTP/1.1 keep-alive (read or not): never after `Connection: close`, HTTP/1.0,
  an answer cut short, an error, a timeout or a cancelled wait.
- A request whose kept-alive connection the replica closes without a byte of answer (`UpstreamClosed`:
  the close crossed the request on the wire) goes out once more on a new connection, and its response
  says so (`resent`); on a new connection the same failure is final. If the new connection is refused,
  the replica may have died of the request itself: that is `UpstreamBroken`, never `UpstreamUnreachable`,
  so the proxy does not hand the request on to another replica.
- `connect_timeout_s` bounds opening a connection (`UpstreamUnreachable`); `read_timeout_s` bounds each
  wait for bytes, the head's and every body chunk's (`UpstreamTimeout`). More than `buffer_bytes` of
  body not yet read pauses reading from the replica until the reader catches up.
- `close()` aborts every connection, idle or in use, and waits until they are gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import NamedTuple
from urllib.parse import urlsplit

from warmplane.services.gateway.http1_connection import Http1Connection, Key
from warmplane.services.gateway.upstream import (
    UpstreamBroken,
    UpstreamClosed,
    UpstreamResponse,
    UpstreamUnreachable,
)

_TARGETS_KEPT = 1024  # parsed replica URLs remembered; the cache is cleared when it grows past this


class _Target(NamedTuple):
    key: Key
    tls: bool
    head: bytes  # the request up to Content-Length's value


class HttpToolsUpstream:
    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        keepalive_s: float,
        buffer_bytes: int = 256 * 1024,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._keepalive_s = keepalive_s
        self._buffer_bytes = buffer_bytes
        self._idle: dict[Key, list[Http1Connection]] = {}  # oldest first
        self._open: set[Http1Connection] = set()
        self._targets: dict[str, _Target] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    def idle_connections(self) -> int:
        """Connections in the pool now, for every replica."""
        return sum(len(idle) for idle in self._idle.values())

    async def post(self, url: str, body: bytes) -> UpstreamResponse:
        """Raises `RuntimeError` once closed."""
        if self._closed:
            raise RuntimeError("the upstream client is closed")
        target = self._targets.get(url) or self._parse(url)
        request = b"".join((target.head, b"%d\r\n\r\n" % len(body), body))
        kept = self._reuse(target.key)
        if kept is None:
            return await self._exchange(await self._connect(target), request, resent=False)
        try:
            return await self._exchange(kept, request, resent=False)
        except UpstreamClosed as closed:  # closed as the request went out, unanswered: sent once more
            try:
                fresh = await self._connect(target)
            except UpstreamUnreachable as refused:
                # The replica may have died of this very request: never let it go on to another one.
                raise UpstreamBroken(f"{closed}, then refused a new connection ({refused})") from refused
        return await self._exchange(fresh, request, resent=True)

    async def _exchange(self, connection: Http1Connection, request: bytes, *, resent: bool) -> _Response:
        """Send `request` on `connection`; return once the answer's head arrived."""
        connection.send(request)
        while not connection.headed:  # a failure after the head is the body's: `read` raises it
            connection.raise_failure()
            await connection.wait()
        return _Response(connection, self._release, resent)

    async def close(self) -> None:
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
        self._idle.clear()
        connections = list(self._open)
        for connection in connections:
            connection.pooled = False
            connection.transport.abort()
        await asyncio.gather(*(connection.lost for connection in connections))

    def _parse(self, url: str) -> _Target:
        """Raises `UpstreamUnreachable` for a URL no connection can be made to (not http(s), a bad port)."""
        try:
            parts = urlsplit(url)
            tls = parts.scheme == "https"
            port = parts.port or (443 if tls else 80)
        except ValueError as exc:
            raise UpstreamUnreachable(f"not a usable URL: {url!r}") from exc
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamUnreachable(f"not an http(s) URL: {url!r}")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.netloc.rpartition("@")[2]
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: "
        target = _Target((parts.hostname, port), tls, head.encode())
        if len(self._targets) >= _TARGETS_KEPT:
            self._targets.clear()
        self._targets[url] = target
        return target

    def _reuse(self, key: Key) -> Http1Connection | None:
        """The newest idle connection to `key` still fresh; expired ones on the way are closed."""
        idle = self._idle.get(key)
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            connection = idle.pop()
            connection.pooled = False
            if now - connection.idle_since < self._keepalive_s and not connection.transport.is_closing():
                return connection
            connection.close()
        return None

    async def _connect(self, target: _Target) -> Http1Connection:
        loop = asyncio.get_running_loop()
        host, port = target.key

        def connection() -> Http1Connection:
            return Http1Connection(
                target.key,
                read_timeout_s=self._read_timeout_s,
                buffer_bytes=self._buffer_bytes,
                on_lost=self._forget,
            )

        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, made = await loop.create_connection(connection, host, port, ssl=target.tls or None)
        except OSError as exc:  # refused, unreachable, DNS, TLS, and TimeoutError (an OSError too)
            raise UpstreamUnreachable(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc
        if self._closed:
            made.transport.abort()
            raise RuntimeError("the upstream client is closed")
        if not made.lost.done():
            self._open.add(made)
        return made

    def _release(self, connection: Http1Connection) -> None:
        if self._closed or not connection.reusable:
            connection.close()
            return
        connection.park()
        loop = asyncio.get_running_loop()
        connection.idle_since = loop.time()
        connection.pooled = True
        self._idle.setdefault(connection.key, []).append(connection)
        if self._sweep is None:
            self._sweep = loop.call_later(self._keepalive_s, self._close_expired)

    def _close_expired(self) -> None:
        """Closes the connections idle `keepalive_s` or longer; runs again while any stay idle."""
        self._sweep = None
        now = asyncio.get_running_loop().time()
        oldest: float | None = None
        for key, idle in list(self._idle.items()):
            while idle and now - idle[0].idle_since >= self._keepalive_s:
                expired = idle.pop(0)
                expired.pooled = False
                expired.close()
            if not idle:
                del self._idle[key]
            elif oldest is None or idle[0].idle_since < oldest:
                oldest = idle[0].idle_since
        if oldest is not None:
            self._sweep = asyncio.get_running_loop().call_at(oldest + self._keepalive_s, self._close_expired)

    def _forget(self, connection: Http1Connection) -> None:
        self._open.discard(connection)
        if connection.pooled:
            connection.pooled = False
            self._idle[connection.key].remove(connection)


class _Response:
    """One answer; after `close()` it is not read again (its connection may carry another request)."""

    def __init__(
        self, connection: Http1Connection, release: Callable[[Http1Connection], None], resent: bool
    ) -> None:
        self.status = connection.status
        self.content_type = connection.content_type
        self.resent = resent
        self._connection = connection
        self._release = release
        self._closed = False

    async def read(self) -> bytes:
        connection = self._usable()
        parts: list[bytes] = []
        while not connection.complete:
            parts.append(connection.take())
            connection.raise_failure()
            await connection.wait()
        parts.append(connection.take())
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def iter_raw(self) -> AsyncIterator[bytes]:
        while True:
            connection = self._usable()
            chunk = connection.take()
            if chunk:
                yield chunk
            elif connection.complete:
                return
            else:
                connection.raise_failure()
                await connection.wait()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._release(self._connection)

    def _usable(self) -> Http1Connection:
        if self._closed:
            raise UpstreamBroken("the answer was closed before it was read")
        return self._connection
