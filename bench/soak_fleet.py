"""The services a soak runs, each a real process of its own (so that its memory, descriptors and tasks are
its own), on parts the caller started: the planner, one node's warmer in front of one engine, the gateway
(result cache on) and the API. Settings are built here and handed to each process as its environment."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from pydantic_settings import BaseSettings

from warmplane.services.api.settings import ApiCaller, ApiOptions, ApiSettings
from warmplane.services.devstack.fleet import engine_settings
from warmplane.services.gateway.settings import (
    GatewayOptions,
    GatewaySettings,
    ResultCacheSettings,
    RoutingSettings,
)
from warmplane.services.planner.settings import IngestSettings, PlannerSettings, PlanSettings
from warmplane.services.warmer.settings import (
    ReadinessSettings,
    WarmerSettings,
    WarmSettings,
)
from warmplane.shared.embedded.processes import free_port, log_tail, start_process, stop_process_group
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, EmbeddedVllm
from warmplane.shared.settings import KafkaSettings, PostgresSettings, RedisSettings, settings_environment

HOST = "127.0.0.1"
TENANTS = ("acme", "globex", "initech")
REPLICA = "soak-r0"
_SCRAPE_TIMEOUT_S = 5.0
_STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Parts:
    """What the caller started: the broker, a migrated database, Redis, and one engine."""

    kafka_servers: str
    dsn: str
    redis_url: str
    engine: EmbeddedVllm


@dataclass(frozen=True, slots=True)
class Reading:
    """One scrape of a service's own process series (`shared/process_metrics.py`)."""

    at_s: float
    rss_bytes: float
    open_fds: float
    loop_tasks: float


@dataclass
class Service:
    """A service's process, where its metrics are served, its log, and what was read of it."""

    name: str
    popen: subprocess.Popen[bytes]
    metrics_url: str
    log_path: Path
    readings: list[Reading] = field(default_factory=list)

    async def totals(self, http: httpx.AsyncClient) -> dict[str, float]:
        """One scrape of its `/metrics`: each sample's value summed over its labels, by sample name."""
        text = (await http.get(self.metrics_url, timeout=_SCRAPE_TIMEOUT_S)).text
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals

    async def read(self, http: httpx.AsyncClient, at_s: float) -> None:
        """Scrape its `/metrics` once into `readings`."""
        values = await self.totals(http)
        self.readings.append(
            Reading(
                at_s,
                values["process_resident_memory_bytes"],
                values["process_open_fds"],
                values[f"warmplane_{self.name}_event_loop_tasks"],
            )
        )


@dataclass(frozen=True, slots=True)
class Credentials:
    """Fresh per soak: the API's admin token, the key control events are signed with, and each tenant's
    gateway key and cache-salt secret."""

    admin_token: str = field(default_factory=lambda: f"soak-admin-{secrets.token_urlsafe(16)}")
    event_key: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    keys: dict[str, str] = field(
        default_factory=lambda: {tenant: f"sk-{tenant}-{secrets.token_urlsafe(16)}" for tenant in TENANTS}
    )
    salts: dict[str, str] = field(default_factory=lambda: {t: secrets.token_urlsafe(24) for t in TENANTS})


class SoakFleet:
    """The four services, started by `running()` and stopped by SIGTERM when it ends (or earlier by
    `stop`), each one's exit code kept in `exit_codes`."""

    def __init__(self, parts: Parts, workdir: Path) -> None:
        self.parts = parts
        self.workdir = workdir
        self.credentials = Credentials()
        run = uuid.uuid4().hex[:8]
        self.kafka = KafkaSettings(
            bootstrap_servers=parts.kafka_servers,
            topic_prefix=f"soak{run}",
            partitions=4,
            session_timeout_ms=6_000,
            heartbeat_interval_ms=1_000,
        )
        self.group = f"planner-soak-{run}"
        self.ports = {
            name: free_port() for name in ("planner", "warmer", "gateway", "gw-metrics", "api", "api-m")
        }
        self.services: dict[str, Service] = {}
        self.exit_codes: dict[str, int] = {}

    @property
    def gateway_url(self) -> str:
        return f"http://{HOST}:{self.ports['gateway']}"

    @property
    def api_url(self) -> str:
        return f"http://{HOST}:{self.ports['api']}"

    @property
    def warmer_url(self) -> str:
        return f"http://{HOST}:{self.ports['warmer']}"

    @property
    def model(self) -> str:
        return self.parts.engine.model_name

    @contextlib.contextmanager
    def running(self) -> Iterator[SoakFleet]:
        try:
            for name, settings, metrics_port in self._settings():
                self._start(name, settings, metrics_port)
            yield self
        finally:
            for name in reversed(self.services):
                self.stop(name)

    def stop(self, name: str) -> None:
        """SIGTERM the service, as an orchestrator stops it; its exit code into `exit_codes`. Idempotent."""
        if name not in self.exit_codes:
            popen = self.services[name].popen
            stop_process_group(popen, _STOP_TIMEOUT_S)
            self.exit_codes[name] = popen.wait()

    def failed(self) -> dict[str, str]:
        """The services that exited on their own (not by `stop`), with their log's tail."""
        return {
            s.name: log_tail(s.log_path)
            for s in self.services.values()
            if s.name not in self.exit_codes and s.popen.poll() is not None
        }

    def _settings(self) -> Iterator[tuple[str, BaseSettings, int]]:
        parts, kafka, cred = self.parts, self.kafka, self.credentials
        postgres = PostgresSettings(url=SecretStr(parts.dsn))
        event_keys = [SecretStr(cred.event_key)]
        salts = {tenant: SecretStr(salt) for tenant, salt in cred.salts.items()}
        yield (
            "planner",
            PlannerSettings(
                kafka=kafka,
                postgres=postgres,
                ingest=IngestSettings(group_id=self.group),
                plans=PlanSettings(min_expected_saved_tokens=0),
                metrics_port=self.ports["planner"],
                event_keys=event_keys,
            ),
            self.ports["planner"],
        )
        engine = parts.engine
        yield (
            "warmer",
            WarmerSettings(
                kafka=kafka,
                node="soak-node",
                engines=[engine_settings(engine, REPLICA)],
                tenant_secrets=salts,
                warm=WarmSettings(request_timeout_s=30),
                readiness=ReadinessSettings(plan_wait_s=120),
                http_host=HOST,
                http_port=self.ports["warmer"],
                event_keys=event_keys,
            ),
            self.ports["warmer"],
        )
        yield (
            "gateway",
            GatewaySettings(
                kafka=kafka,
                postgres=postgres,
                redis=RedisSettings(url=SecretStr(parts.redis_url)),
                tenant_keys={tenant: [SecretStr(key)] for tenant, key in cred.keys.items()},
                tenant_secrets=salts,
                gateway=GatewayOptions(
                    http_host=HOST,
                    http_port=self.ports["gateway"],
                    metrics_host=HOST,
                    metrics_port=self.ports["gw-metrics"],
                    block_size=BLOCK_SIZE,
                    instance="soak",
                ),
                routing=RoutingSettings(ramp_s=0),
                result_cache=ResultCacheSettings(enabled=True),
                event_keys=event_keys,
            ),
            self.ports["gw-metrics"],
        )
        yield (
            "api",
            ApiSettings(
                kafka=kafka,
                postgres=postgres,
                api=ApiOptions(
                    http_host=HOST,
                    http_port=self.ports["api"],
                    metrics_host=HOST,
                    metrics_port=self.ports["api-m"],
                ),
                api_callers=[ApiCaller(name="soak", token=SecretStr(cred.admin_token), role="admin")],
                event_keys=event_keys,
            ),
            self.ports["api-m"],
        )

    def _start(self, name: str, settings: BaseSettings, metrics_port: int) -> None:
        log_path = self.workdir / f"{name}.log"
        proc = start_process(
            [sys.executable, "-m", f"warmplane.services.{name}"],
            log_path,
            env={"PATH": "/usr/bin:/bin", **settings_environment(settings)},
        )
        self.services[name] = Service(name, proc, f"http://{HOST}:{metrics_port}/metrics", log_path)
