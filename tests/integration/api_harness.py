"""Running the API in integration tests: the real app on a free port over the real Postgres and broker."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import SecretStr

from warmplane.services.api.app import build_app
from warmplane.services.api.deps import ApiDeps
from warmplane.services.api.service import api_deps
from warmplane.services.api.settings import ApiCaller, ApiOptions, ApiSettings
from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.asgi_server import AsgiServer
from warmplane.shared.metrics_http import metrics_app

ADMIN = "admin-token-0123456789"
READER = "reader-token-0123456789"
ACME = "acme-token-0123456789ab"
GLOBEX = "globex-token-0123456789"


def api_settings(planner: PlannerSettings) -> ApiSettings:
    """API settings over the planner's broker, topics and database, with one token of each kind."""
    tokens = [
        ApiCaller(name="ci", token=SecretStr(ADMIN), role="admin"),
        ApiCaller(name="grafana", token=SecretStr(READER), role="reader"),
        ApiCaller(name="acme-oncall", token=SecretStr(ACME), role="tenant", tenant="acme"),
        ApiCaller(name="globex-oncall", token=SecretStr(GLOBEX), role="tenant", tenant="globex"),
    ]
    options = ApiOptions(http_host="127.0.0.1", http_port=0)
    return ApiSettings(
        kafka=planner.kafka,
        postgres=planner.postgres,
        api=options,
        statistics=planner.statistics,
        api_callers=tokens,
    )


@dataclass
class RunningApi:
    url: str
    deps: ApiDeps
    metrics_url: str
    """The metrics port's base URL (`/metrics` is not served on `url`)."""


@contextlib.asynccontextmanager
async def running_api(settings: ApiSettings) -> AsyncIterator[RunningApi]:
    async with api_deps(settings) as deps:
        server = AsgiServer(build_app(deps), "127.0.0.1", 0, name="api")
        metrics = AsgiServer(metrics_app(deps.metrics.registry), "127.0.0.1", 0, name="api metrics")
        await server.start()
        try:
            await metrics.start()
            yield RunningApi(f"http://127.0.0.1:{server.port}", deps, f"http://127.0.0.1:{metrics.port}")
        finally:
            await metrics.stop()
            await server.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
