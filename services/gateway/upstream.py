"""The gateway's client for its replicas: POST a body, get a status and a body to read or stream.

`Upstream` is what the proxy needs; `httptools_upstream.HttpToolsUpstream` is the real one: pooled
keep-alive HTTP/1.1 on asyncio Protocols, answers parsed by httptools. Chosen by measurement, as the
client was the largest piece of the gateway's own cost besides the socket writes: on this machine one
keep-alive POST and the read of its answer cost about 35 us of client CPU with it, 157-188 us with
aiohttp (the client before it) and about 1,025 us with httpx (medians of 2,000, same local server,
uvloop). Against a stub replica (`python -m bench.gateway_profile stack --requests 2000`, six runs
each, alternating with the aiohttp gateway), the gateway's added p50 went from 0.42-0.71 ms to
0.29-0.52 ms: 1.37-1.49 times vllm-router's over the same stub, from 1.93-2.09.

Failures are sorted by what the proxy may do next:
- `UpstreamUnreachable`: no connection was made, so no byte of the request can have been acted on:
  the next replica may be tried.
- `UpstreamTimeout`: the replica went silent longer than the read timeout (504, never retried).
- `UpstreamBroken`: anything else after the connection was made (disconnected, reset, a broken
  body): the request may have run, so it is answered 502 and never retried.
- `UpstreamClosed`, the one `UpstreamBroken` the client itself may act on: a kept-alive connection the
  replica closed without a byte of answer as the request went out (its idle timeout raced the pool's,
  or it restarted). The replica answered nothing, so `HttpToolsUpstream` sends the request once more on
  a new connection to it, as browsers do for a reused connection (Go's net/http does only for idempotent
  requests); only a failure of that one reaches the proxy, and a refused connection then is
  `UpstreamBroken` (the replica may have died of the request: it goes to no other).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol


class UpstreamUnreachable(Exception):
    """The replica took no connection (refused, unreachable, connect timeout)."""


class UpstreamTimeout(Exception):
    """The replica was silent longer than the read timeout."""


class UpstreamBroken(Exception):
    """The exchange failed after the connection was made; `str()` names what broke."""


class UpstreamClosed(UpstreamBroken):
    """The replica closed the connection before a byte of its answer arrived."""


class UpstreamResponse(Protocol):
    status: int
    content_type: str | None
    resent: bool
    """Whether the request went out again on a new connection (see `UpstreamClosed`)."""

    async def read(self) -> bytes:
        """The whole body. Raises `UpstreamTimeout` or `UpstreamBroken`."""

    def iter_raw(self) -> AsyncIterator[bytes]:
        """The body as it arrives. Raises `UpstreamTimeout` or `UpstreamBroken` while iterating."""

    async def close(self) -> None:
        """Give the connection back, or close it if the answer did not arrive whole. Never raises."""


class Upstream(Protocol):
    async def post(self, url: str, body: bytes) -> UpstreamResponse:
        """Send `body` as JSON; return once the status and headers arrived. Raises the errors above."""

    async def close(self) -> None: ...
