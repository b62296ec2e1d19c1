"""The warmer's HTTP face: readiness for the pod's probe, status for people, metrics for Prometheus.

GET /ready            200 when every replica of this warmer is ready, else 503 (the pod's readiness probe)
GET /ready/{replica}  the same for one replica; 404 for one this warmer does not drive
GET /status           every replica: phase, readiness, reason, plan progress, prefixes held, and what
                      the engine's KV events say it holds (JSON)
GET /drained          200 once every replica of this warmer is announced stopped after a drain, else 503
                      (the engine container's preStop hook waits for it before vLLM shuts down)
GET /healthz          200 while every loop of the warmer runs, else 503 (liveness: unlike /ready, it says
                      nothing about warmth; a pod whose plan consumer died is restarted)
GET /metrics          Prometheus text

Everything here reads; nothing changes state, so nothing here needs a credential. No answer names a
prefix, a payload or a tenant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from warmplane.shared.asgi_server import AsgiServer

if TYPE_CHECKING:
    from warmplane.services.warmer.replica_driver import ReplicaDriver
    from warmplane.services.warmer.residency_watch import ResidencyWatch
    from warmplane.services.warmer.service import Warmer


def replica_status(driver: ReplicaDriver) -> dict[str, Any]:
    tracker = driver.tracker
    report = driver.progress()
    plan = tracker.running
    return {
        "replica": driver.replica,
        "endpoint": driver.engine.announced_url,
        "model": driver.engine.served_model,
        "phase": str(tracker.phase),
        "ready": tracker.ready,
        "partial": tracker.partial,
        "reason": tracker.reason,
        "incarnation": str(tracker.incarnation) if tracker.incarnation else None,
        "prefixes_held": len(tracker.held),
        "running_plan": str(plan.plan_id) if plan is not None else None,
        "plan": None
        if report is None
        else {
            "plan_id": str(report.plan_id),
            "items_done": report.items_done,
            "items_total": report.items_total,
            "verified": len(report.verified) + report.already_held,
            "tokens_prefilled": report.tokens_prefilled,
            "failures": len(report.failures),
        },
        "residency": None if driver.residency is None else residency_status(driver.residency),
    }


def residency_status(watch: ResidencyWatch) -> dict[str, Any]:
    """What the engine's KV events say: prefixes held and lost, whether the stream is whole."""
    found, index = watch.last, watch.feed.index
    return {
        "held": None if found is None else len(found.held),
        "lost": watch.lost,
        "unsure": None if found is None else len(found.unsettled),
        "events_complete": index.complete,
        "event_gaps": index.gaps,
        "blocks_known": len(index),
        "engine_restarts": watch.feed.restarts,
    }


def build_app(warmer: Warmer) -> Starlette:
    async def ready(request: Request) -> Response:
        replicas = {name: driver.tracker.ready for name, driver in warmer.drivers.items()}
        code = 200 if warmer.ready() else 503
        return JSONResponse({"ready": code == 200, "replicas": replicas}, status_code=code)

    async def ready_one(request: Request) -> Response:
        name = request.path_params["replica"]
        driver = warmer.drivers.get(name)
        if driver is None:
            return JSONResponse({"error": f"this warmer drives no replica {name!r}"}, status_code=404)
        tracker = driver.tracker
        body = {"ready": tracker.ready, "partial": tracker.partial, "reason": tracker.reason}
        return JSONResponse(body, status_code=200 if tracker.ready else 503)

    async def status(request: Request) -> Response:
        replicas = [replica_status(driver) for driver in warmer.drivers.values()]
        return JSONResponse({"node": warmer.node, "ready": warmer.ready(), "replicas": replicas})

    async def drained(request: Request) -> Response:
        code = 200 if warmer.drained() else 503
        return JSONResponse({"drained": code == 200}, status_code=code)

    async def healthz(request: Request) -> Response:
        if warmer.alive():
            return PlainTextResponse("ok\n")
        return PlainTextResponse("a warmer loop stopped; see the log\n", status_code=503)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(warmer.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/ready", ready),
            Route("/ready/{replica}", ready_one),
            Route("/status", status),
            Route("/drained", drained),
            Route("/healthz", healthz),
            Route("/metrics", metrics),
        ]
    )


def status_server(warmer: Warmer, host: str, port: int) -> AsgiServer:
    """Uvicorn serving `build_app(warmer)` on `host:port` inside the running event loop."""
    return AsgiServer(build_app(warmer), host, port, name="warmer status")
