"""The warmer's HTTP face: readiness for the pod's probe, status for people, metrics for Prometheus.

GET /ready            200 when every replica of this warmer is ready, else 503 (the pod's readiness probe)
GET /ready/{replica}  the same for one replica; 404 for one this warmer does not drive
GET /status           every replica: phase, readiness, reason, plan progress, prefixes held (JSON)
GET /healthz          200 while every loop of the warmer runs, else 503 (liveness: unlike /ready, it says
                      nothing about warmth; a pod whose plan consumer died is restarted)
GET /metrics          Prometheus text

Everything here reads; nothing changes state, so nothing here needs a credential. No answer names a
prefix, a payload or a tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING, Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

if TYPE_CHECKING:
    from warmplane.services.warmer.replica_driver import ReplicaDriver
    from warmplane.services.warmer.service import Warmer


def replica_status(driver: ReplicaDriver) -> dict[str, Any]:
    tracker = driver.tracker
    report = driver.progress()
    plan = tracker.running
    return {
        "replica": driver.replica,
        "endpoint": driver.engine.url,
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
            Route("/healthz", healthz),
            Route("/metrics", metrics),
        ]
    )


class StatusServer:
    """Uvicorn serving `build_app(warmer)` on `host:port` inside the running event loop."""

    def __init__(self, warmer: Warmer, host: str, port: int) -> None:
        self._warmer = warmer
        self._host = host
        self._port = port
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None

    @property
    def port(self) -> int:
        if self._socket is None:
            raise RuntimeError("the status server is not started")
        port: int = self._socket.getsockname()[1]
        return port

    async def start(self) -> None:
        # Bind first, so port 0 gets a free port we know before anyone probes us.
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        # IPPROTO_TCP, not 0: uvicorn sets TCP_NODELAY only on sockets that say they are TCP, and
        # without it every answer waited about 44 ms for a delayed ACK.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        self._socket = sock
        config = uvicorn.Config(
            build_app(self._warmer), log_level="warning", access_log=False, lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="warmer http")
        while not self._server.started:
            if self._task.done():
                await self._task  # raises what stopped it
                raise RuntimeError("the status server stopped while starting")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._task, 5)
        if self._socket is not None:
            self._socket.close()
