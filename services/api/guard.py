"""The API's door, in front of FastAPI: every `/v1/` request is authenticated, rate-limited and its body
bounded and typed before any route reads or parses it.

In order, each refusal before the next check runs: no or unknown token 401; over the caller's rate
429 with `Retry-After`; a body larger than `max_body_bytes` (declared or read) 413; a body that is not
`application/json` 415 (a request without a body goes on to routing: a method not served is a 405).
The body is read here, at most `max_body_bytes` of it, and handed on whole, so an anonymous caller never
gets a multi-megabyte body read or a malformed one parsed (FastAPI parses a body before it resolves the
route's token dependency).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from warmplane.services.api.auth import Principal, TokenBook, Unauthenticated
from warmplane.shared.rate_limit import RateLimiter, RateLimitSettings


class ApiGuard:
    def __init__(
        self,
        app: ASGIApp,
        tokens: TokenBook,
        max_body_bytes: int,
        rate_limit: RateLimitSettings,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._app = app
        self._tokens = tokens
        self._limit = max_body_bytes
        self._rates = RateLimiter(rate_limit)
        self._monotonic = monotonic

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self._app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            caller = self._tokens.authenticate(headers.get("authorization"))
        except Unauthenticated as exc:
            await _refuse(401, str(exc), scope, receive, send, headers={"WWW-Authenticate": "Bearer"})
            return
        wait_s = self._rates.take(_rate_key(caller), self._monotonic())
        if wait_s:
            message = f"over this token's rate limit: retry in {wait_s} s"
            await _refuse(429, message, scope, receive, send, headers={"Retry-After": str(wait_s)})
            return
        if headers.get("content-length", "0") != "0" or "chunked" in headers.get("transfer-encoding", ""):
            await self._with_body(scope, receive, send, headers)
            return
        await self._app(scope, receive, send)

    async def _with_body(self, scope: Scope, receive: Receive, send: Send, headers: Headers) -> None:
        too_large = f"the request body exceeds the API's limit of {self._limit} bytes"
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._limit:
            await _refuse(413, too_large, scope, receive, send)
            return
        kind = headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind != "application/json":
            await _refuse(415, "send the body as Content-Type: application/json", scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self._limit:
                await _refuse(413, too_large, scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        await self._app(scope, _replay(bytes(body), receive), send)


def _rate_key(caller: Principal) -> str:
    """A tenant's tokens share one budget; a reader's or admin's token has its own."""
    return f"tenant:{caller.tenant}" if caller.tenant is not None else f"token:{caller.name}"


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()  # only a disconnect comes after the body
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


async def _refuse(
    status: int,
    message: str,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    headers: dict[str, str] | None = None,
) -> None:
    await JSONResponse({"error": message}, status_code=status, headers=headers)(scope, receive, send)
