"""The gateway's client for its replicas: POST a body, get a status and a body to read or stream.

`Upstream` is what the proxy needs; `AiohttpUpstream` is the real one. aiohttp rather than httpx: on
this machine one keep-alive POST costs about 155 us of client time with aiohttp and 1,025 us with
httpx (medians of 2,000, same local server), the largest part of the gateway's added latency.

Failures are sorted by what the proxy may do next:
- `UpstreamUnreachable`: no connection was made, so no byte of the request can have been acted on:
  the next replica may be tried.
- `UpstreamTimeout`: the replica went silent longer than the read timeout (504, never retried).
- `UpstreamBroken`: anything else after the connection was made (disconnected, reset, a broken
  body): the request may have run, so it is answered 502 and never retried.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import aiohttp


class UpstreamUnreachable(Exception):
    """The replica took no connection (refused, unreachable, connect timeout)."""


class UpstreamTimeout(Exception):
    """The replica was silent longer than the read timeout."""


class UpstreamBroken(Exception):
    """The exchange failed after the connection was made; `str()` names what broke."""


class UpstreamResponse(Protocol):
    status: int
    content_type: str | None

    async def read(self) -> bytes:
        """The whole body. Raises `UpstreamTimeout` or `UpstreamBroken`."""

    def iter_raw(self) -> AsyncIterator[bytes]:
        """The body as it arrives. Raises `UpstreamTimeout` or `UpstreamBroken` while iterating."""

    async def close(self) -> None:
        """Give the connection back (or drop it if the body was not read to its end). Never raises."""


class Upstream(Protocol):
    async def post(self, url: str, body: bytes) -> UpstreamResponse:
        """Send `body` as JSON; return once the status and headers arrived. Raises the errors above."""

    async def close(self) -> None: ...


class AiohttpUpstream:
    """One connection pool for every replica. `keepalive_s` must stay under the replicas' own idle
    timeout (vLLM's uvicorn closes idle connections after 5 s), or a request can meet a connection the
    replica just closed."""

    def __init__(self, *, connect_timeout_s: float, read_timeout_s: float, keepalive_s: float) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=keepalive_s),
            timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s),
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            auto_decompress=False,
        )

    async def post(self, url: str, body: bytes) -> UpstreamResponse:
        try:
            response = await self._session.post(url, data=body, headers=_JSON)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise UpstreamUnreachable(type(exc).__name__) from exc
        except (TimeoutError, aiohttp.SocketTimeoutError) as exc:
            raise UpstreamTimeout(type(exc).__name__) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamBroken(type(exc).__name__) from exc
        return _AiohttpResponse(response)

    async def close(self) -> None:
        await self._session.close()


_JSON = {"Content-Type": "application/json"}


class _AiohttpResponse:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.content_type = response.headers.get("Content-Type")

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except (TimeoutError, aiohttp.SocketTimeoutError) as exc:
            raise UpstreamTimeout(type(exc).__name__) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamBroken(type(exc).__name__) from exc

    async def iter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.SocketTimeoutError) as exc:
            raise UpstreamTimeout(type(exc).__name__) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamBroken(type(exc).__name__) from exc

    async def close(self) -> None:
        self._response.release()
