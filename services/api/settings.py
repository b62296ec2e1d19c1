"""The API's settings: `WARMPLANE_API_CALLERS` and `WARMPLANE_API__*` on top of the shared parts.

Example:
    WARMPLANE_API_CALLERS='[{"name": "ci", "token": "...", "role": "admin"},
                           {"name": "grafana", "token": "...", "role": "reader"},
                           {"name": "acme-oncall", "token": "...", "role": "tenant", "tenant": "acme"}]'
    WARMPLANE_API__HTTP_PORT=8070

Roles: `admin` reads everything (payload previews included) and may act (bump an epoch, announce a
deploy or a scale, re-warm a replica); `reader` reads every tenant's figures but no payloads (a
dashboard's token); `tenant` reads that one tenant's figures and payloads, and nothing of the fleet that
names another tenant. Tokens are secrets: they never print, and only their names reach the logs.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from warmplane.shared.rate_limit import RateLimitSettings
from warmplane.shared.settings import MIN_KEY_CHARS, DatabaseSettings, StatisticsSettings

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00]+$")]
Role = Literal["admin", "reader", "tenant"]


class ApiCaller(BaseModel):
    """One bearer token: who holds it (`name`, for the logs), what it may do, and for `tenant`, which one."""

    name: Name
    token: SecretStr
    role: Role
    tenant: Name | None = None

    @field_validator("token")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value()) < MIN_KEY_CHARS:
            raise ValueError(f"a token must be at least {MIN_KEY_CHARS} characters")
        return value

    @model_validator(mode="after")
    def _tenant_iff_tenant_role(self) -> Self:
        if (self.role == "tenant") != (self.tenant is not None):
            raise ValueError("`tenant` is required for role 'tenant' and only for it")
        return self


class ApiOptions(BaseModel):
    """How the API serves."""

    http_host: str = "0.0.0.0"  # noqa: S104 - platform teams and CI reach the API from outside its pod
    http_port: Annotated[int, Field(ge=0, le=65_535)] = 8070
    """`/v1/...` (OpenAPI at `/openapi.json`, `/docs`), `/status`, `/healthz`, `/readyz`."""
    metrics_host: str = "0.0.0.0"  # noqa: S104 - Prometheus scrapes the pod's address
    """The address `/metrics` is served on."""
    metrics_port: Annotated[int, Field(ge=0, le=65_535)] = 9466
    """`/metrics` only (per-tenant health figures), not on `http_port`: deployments keep this port inside
    the cluster (`infra/k8s`: no Service names it; compose: not published)."""
    max_body_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024
    """Larger request bodies get a 413, read no further; bodies not sent as `application/json` a 415."""
    rate_limit: RateLimitSettings = RateLimitSettings()
    """Requests per tenant (its tokens share one budget), per token for readers and admins
    (`WARMPLANE_API__RATE_LIMIT__REQUESTS_PER_S`, `__BURST`); off by default; over it a 429."""
    warm_sets_cache_s: Annotated[float, Field(ge=0)] = 10.0
    """How long a `/v1/warm-sets` answer is reused for the same model, tenant scope and window (0: never):
    it reads every chain node of each warm scope, and the status page asks for every model every 5 s."""
    default_window_s: Annotated[int, Field(ge=60, le=30 * 86_400)] = 3_600
    """The time window a figure covers when the request names none."""
    health_refresh_s: Annotated[float, Field(gt=0)] = 15.0
    """How often the health gauges (hit rate, cold starts per tenant and model) are read from Postgres."""


class ApiSettings(DatabaseSettings):
    api: ApiOptions = ApiOptions()
    statistics: StatisticsSettings = StatisticsSettings()
    api_callers: list[ApiCaller] = Field(default_factory=list)
    """JSON list of `{"name", "token", "role"[, "tenant"]}`; roles `admin` (all, and actions), `reader` (every
    tenant, no payloads), `tenant` (that tenant only); tokens are secrets, at least 16 characters."""

    @field_validator("api_callers")
    @classmethod
    def _distinct(cls, tokens: list[ApiCaller]) -> list[ApiCaller]:
        secrets = [t.token.get_secret_value() for t in tokens]
        if len(set(secrets)) != len(secrets):
            raise ValueError("two entries share a token")
        names = [t.name for t in tokens]
        if len(set(names)) != len(names):
            raise ValueError("two entries share a name")
        return tokens
