"""`/metrics` on a port of its own (the gateway's and the API's): the Prometheus text of one registry,
and 404 for anything else. Served apart from the clients' port because the figures are per tenant:
deployments keep this port inside the cluster."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send


def metrics_app(registry: CollectorRegistry) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics" and scope["method"] in ("GET", "HEAD"):
            response: Response = Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
        else:
            response = PlainTextResponse("only GET /metrics is served on this port\n", status_code=404)
        await response(scope, receive, send)

    return app
