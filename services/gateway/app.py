"""The gateway's HTTP face, and `bootstrap()`, which wires it to real or fake parts.

POST /v1/completions, /v1/chat/completions   OpenAI-compatible, streaming or not (`proxy.py`)
GET  /v1/models                               the models some replica serves (needs an API key)
GET  /healthz                                 200 while the process serves (liveness)
Any other path or method answers an OpenAI-shaped 404 or 405.

`/metrics` (`warmplane_gateway_*`, counted per tenant) is `GatewayParts.metrics_app`, served on the
metrics port (`GatewayOptions.metrics_port`), which deployments keep inside the cluster: never here.

A POST to one of the two completion paths goes straight from the ASGI scope to `Proxy.handle`; the
rest goes through Starlette's routing and middleware, which cost the completion routes about 25 us of
their ~200 us in-process (`python -m bench.gateway_profile app`). An exception escaping the proxy is
answered 500 by the server either way.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from warmplane.services.gateway.errors import INVALID_REQUEST, ApiError
from warmplane.services.gateway.membership import Membership
from warmplane.services.gateway.metrics import GatewayMetrics
from warmplane.services.gateway.observations import EventSink, Observer
from warmplane.services.gateway.openai_request import PATHS, Kind
from warmplane.services.gateway.proxy import Proxy, error_response
from warmplane.services.gateway.result_cache import ResultCache
from warmplane.services.gateway.result_stores import ResultStores
from warmplane.services.gateway.router import Router
from warmplane.services.gateway.settings import GatewaySettings
from warmplane.services.gateway.tenants import EpochBook, TenantDirectory
from warmplane.services.gateway.text_embedding import Embedder, NgramEmbedder
from warmplane.services.gateway.upstream import Upstream
from warmplane.shared.cache_salt import SaltBook
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.metrics_http import metrics_app


@dataclass(frozen=True, slots=True)
class GatewayParts:
    app: ASGIApp
    metrics_app: ASGIApp
    proxy: Proxy
    router: Router
    epochs: EpochBook
    metrics: GatewayMetrics
    results: ResultCache | None


def bootstrap(
    settings: GatewaySettings,
    *,
    membership: Membership,
    sink: EventSink,
    client: Upstream,
    epochs: EpochBook | None = None,
    stores: ResultStores | None = None,
    embedder: Embedder | None = None,
    new_id: Callable[[], uuid.UUID] = new_event_id,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> GatewayParts:
    """The gateway over `membership`, forwarding with `client`, emitting into `sink`; with a result
    cache over `stores` when they are given, its semantic tier embedding with `embedder` (the service opens
    the settings' one, `embedders.open_embedder`; without one, the no-model fallback). No I/O here."""
    metrics = GatewayMetrics(CollectorRegistry())
    epochs = epochs if epochs is not None else EpochBook()
    router = Router(membership, settings.routing)
    results = None
    if stores is not None:
        if embedder is None:
            embedder = NgramEmbedder(settings.result_cache.embedding_dimensions)
        results = ResultCache(
            settings.result_cache, stores.answers, stores.index, embedder, metrics, hot=stores.hot
        )
        epochs.watch(results.epoch_bumped)
    options = settings.gateway
    observer = Observer(
        sink,
        metrics,
        producer=f"gateway/{options.instance}",
        block_size=options.block_size,
        payload_memory=options.payload_memory,
        new_id=new_id,
        clock=clock,
    )
    proxy = Proxy(
        tenants=TenantDirectory(settings.tenant_keys),
        salts=SaltBook(settings.tenant_secrets),
        epochs=epochs,
        router=router,
        client=client,
        observer=observer,
        metrics=metrics,
        options=options,
        routing=settings.routing,
        results=results,
    )
    app = build_app(proxy, membership)
    return GatewayParts(app, metrics_app(metrics.registry), proxy, router, epochs, metrics, results)


class GatewayApp:
    """The completion routes served directly, everything else by `rest` (Starlette)."""

    def __init__(self, proxy: Proxy, rest: ASGIApp) -> None:
        self._proxy = proxy
        self._rest = rest
        self._kinds: dict[str, Kind] = {path: kind for kind, path in PATHS.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            kind = self._kinds.get(scope["path"])
            if kind is not None:
                response = await self._proxy.handle(kind, Request(scope, receive))
                await response(scope, receive, send)
                return
        await self._rest(scope, receive, send)


def build_app(proxy: Proxy, membership: Membership) -> GatewayApp:
    async def completions(request: Request) -> Response:
        return await proxy.handle("completions", request)

    async def chat(request: Request) -> Response:
        return await proxy.handle("chat", request)

    async def models(request: Request) -> Response:
        try:
            proxy.admit(request)
        except ApiError as error:
            return error_response(error)
        data = [{"id": name, "object": "model", "owned_by": "warmplane"} for name in membership.models()]
        return JSONResponse({"object": "list", "data": data})

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        message = f"{request.method} {request.url.path} is not served here (HTTP {status})."
        return error_response(ApiError(status, message, type=INVALID_REQUEST, code=f"http_{status}"))

    rest = Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        exception_handlers={404: http_error, 405: http_error},
    )
    return GatewayApp(proxy, rest)
