"""The API's ASGI app: routes, errors in one shape, request metrics, the status page.

GET  /v1/...            read endpoints (`routes_read.py`, `routes_replicas.py`), a token of any role
POST /v1/...            admin actions (`routes_admin.py`), an admin token
GET  /status            the status page (the token is given in the page, never in its URL's query)
GET  /healthz           200 while the process serves; /readyz 200 once Postgres answers
GET  /openapi.json      the published contract, /docs its rendering

Every `/v1/` request passes `ApiGuard` first (token, rate, body size and type). `/metrics` (per-tenant
health figures) is not served here but on the metrics port (`metrics_app`), which stays in the cluster.
"""

from __future__ import annotations

import logging
import time
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from warmplane.services.api import routes_admin, routes_read, routes_replicas
from warmplane.services.api.auth import Forbidden, Unauthenticated
from warmplane.services.api.deps import ApiDeps
from warmplane.services.api.guard import ApiGuard
from warmplane.services.api.routes_admin import BrokerUnavailable

log = logging.getLogger(__name__)


def build_app(deps: ApiDeps) -> FastAPI:
    app = FastAPI(
        title="Warmplane API",
        version="1",
        summary="Warm-set state, replicas, epochs, hit rates and top misses of a vLLM fleet; admin actions.",
    )
    app.state.deps = deps
    app.include_router(routes_read.router)
    app.include_router(routes_replicas.router)
    app.include_router(routes_admin.router)
    _add_error_handlers(app)
    _add_operational_routes(app, deps)
    options = deps.options
    app.add_middleware(
        ApiGuard, tokens=deps.tokens, max_body_bytes=options.max_body_bytes, rate_limit=options.rate_limit
    )
    app.add_middleware(_RequestMetrics, deps=deps)
    return app


def _problem(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(Unauthenticated)
    async def unauthenticated(request: Request, exc: Unauthenticated) -> Response:
        return _problem(401, str(exc), {"WWW-Authenticate": "Bearer"})

    @app.exception_handler(Forbidden)
    async def forbidden(request: Request, exc: Forbidden) -> Response:
        return _problem(403, str(exc))

    @app.exception_handler(BrokerUnavailable)
    async def broker_unavailable(request: Request, exc: BrokerUnavailable) -> Response:
        log.warning("%s", exc, exc_info=exc.__cause__)
        return _problem(503, f"{exc}; retry later")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return _problem(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        reasons = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error.get("loc", ()))
            reasons.append(f"{where}: {error.get('msg', 'invalid')}")
        return _problem(422, "; ".join(reasons) or "invalid request")


def _add_operational_routes(app: FastAPI, deps: ApiDeps) -> None:
    page = resources.files("warmplane.services.api").joinpath("status.html").read_text(encoding="utf-8")

    @app.get("/status", include_in_schema=False)
    async def status_page() -> HTMLResponse:
        return HTMLResponse(page, headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> Response:
        try:
            await deps.read.ping()
        except Exception as exc:
            return _problem(503, f"Postgres does not answer: {type(exc).__name__}")
        return PlainTextResponse("ok")


class _RequestMetrics:
    """Counts and times every request by its route template (not its path: ids would explode labels)."""

    def __init__(self, app: ASGIApp, deps: ApiDeps) -> None:
        self._app = app
        self._metrics = deps.metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self._metrics.requests.labels(route=route, status=str(status)).inc()
            self._metrics.latency.labels(route=route).observe(time.perf_counter() - began)
