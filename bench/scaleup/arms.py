"""The scenario's arms: what stands in front of the same engines, and how a new replica joins behind it.

- `WarmplaneArm(warm=True)`: the embedded broker, PostgreSQL and Redis; the planner, one warmer per node
  and the gateway, each its own process started from `WARMPLANE_*` settings as a platform team runs them.
  The join is an autoscaler's: `fleet.scaled` is published, then the new node's engine and its warmer
  start together (a pod with its sidecar). The warmer announces the replica, the planner plans it, the
  warmer pre-fills and verifies at low priority, and the gateway ramps it in once `/ready`.
- `WarmplaneArm(warm=False)`: the same, with the new node's warmer set not to warm
  (`WARMPLANE_READINESS__WARM=false`): ready as soon as its engine answers, ramped in the same way.
- `RouterArm(policy)`: `vllm-router` over the same engines; the newcomer is added (`POST /add_worker`) as
  soon as its engine answers `/health`, as service discovery adds a pod whose readiness probe passed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import httpx

from bench.cpu_time import process_cpu_seconds, tree_cpu_seconds
from warmplane.shared import migrate
from warmplane.shared.embedded import EmbeddedStack
from warmplane.shared.embedded.processes import (
    free_port,
    log_tail,
    start_process,
    stop_process_group,
    wait_until,
)
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, EmbeddedVllm
from warmplane.shared.emitter import Emitter
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import FleetScaled, ModelRef
from warmplane.shared.settings import EmitterSettings, KafkaSettings
from warmplane.shared.topics import Topics

MODEL = "smol"
TENANT = "bench"
API_KEY = "sk-scaleup-bench"
SECRET = "scaleup-bench-cache-salt-secret"
ROUTING_DEPTH = 1
"""The conversation trace's requests share their first block (message): route by the second."""
STOP_TIMEOUT_S = 20.0
READY_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class Replica:
    name: str
    engine: EmbeddedVllm


class Processes:
    """The processes one run starts, each stopped on `stack`; `check()` says if one died on its own, and
    `cpu_seconds()` what each part (its process and descendants) has used so far."""

    def __init__(self, stack: ExitStack, workdir: Path) -> None:
        self.stack, self.workdir = stack, workdir
        self._watched: list[tuple[subprocess.Popen[bytes], Path]] = []
        self._parts: dict[str, Callable[[], int | None]] = {"bench (load, this process)": os.getpid}

    def part(self, name: str, pid: Callable[[], int | None]) -> None:
        """Count `name`'s CPU from the process `pid()` names (None while it is not running)."""
        self._parts[name] = pid

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds each part has used so far; this process's own, without its children's."""
        used = {}
        for name, pid in self._parts.items():
            if (number := pid()) is None:
                continue
            own = number == os.getpid()
            used[name] = sum(process_cpu_seconds(number)) if own else tree_cpu_seconds(number)
        return used

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = self.workdir / f"{name}.log"
        proc = start_process(argv, log, env=None if env is None else {**os.environ, **env})
        self.stack.callback(stop_process_group, proc, STOP_TIMEOUT_S)
        self._watched.append((proc, log))
        self.part(name, lambda: proc.pid)

    def service(self, name: str, module: str, env: dict[str, str]) -> None:
        self.start(name, [sys.executable, "-m", module], env)

    def check(self) -> None:
        """Raise, naming its log, if a process this run started has exited on its own."""
        for proc, log in self._watched:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{log.stem} exited with {proc.returncode} mid-run: see {log}\n{log_tail(log)}"
                )


def wait_answered(url: str, headers: dict[str, str], what: str, processes: Processes) -> None:
    """Until a one-token chat request through `url` is answered (not part of the measured traffic)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "ready"}], "max_tokens": 1}

    def answered() -> bool:
        processes.check()
        try:
            return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30).is_success
        except httpx.HTTPError:
            return False

    wait_until(answered, timeout_s=READY_TIMEOUT_S, what=what)


class Arm(Protocol):
    name: str

    @property
    def url(self) -> str: ...

    @property
    def headers(self) -> dict[str, str]: ...

    def start(self, processes: Processes, first: Replica) -> None:
        """Start what fronts `first` (already serving); return once a request through `url` is answered."""

    async def join(self, processes: Processes, newcomer: Replica) -> None:
        """Announce the scale-up; the newcomer's engine is being started beside this call."""


class WarmplaneArm:
    def __init__(self, *, warm: bool, warm_seconds: float, prefill_tokens_per_s: float | None) -> None:
        self.name = "warmplane" if warm else "gateway-cold"
        self._warm = warm
        self._warm_seconds = warm_seconds
        self.prefill_tokens_per_s = prefill_tokens_per_s
        """The engine's prefill rate the planner's budget assumes; None until the calibration measures it."""
        self._common: dict[str, str] = {}
        self._port = 0
        self._kafka: KafkaSettings | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"}

    def start(self, processes: Processes, first: Replica) -> None:
        parts = processes.stack.enter_context(EmbeddedStack(processes.workdir / "parts"))
        for part in (parts.kafka, parts.postgres, parts.redis):
            processes.part(part.name, lambda part=part: part.pid)  # type: ignore[misc]
        migrate.upgrade(parts.postgres.sqlalchemy_url)
        self._kafka = KafkaSettings(
            bootstrap_servers=parts.kafka.bootstrap_servers,
            session_timeout_ms=2_000,
            heartbeat_interval_ms=500,
        )
        self._common = {
            "WARMPLANE_KAFKA__BOOTSTRAP_SERVERS": parts.kafka.bootstrap_servers,
            "WARMPLANE_KAFKA__SESSION_TIMEOUT_MS": "2000",
            "WARMPLANE_KAFKA__HEARTBEAT_INTERVAL_MS": "500",
            "WARMPLANE_KAFKA__MAX_EVENT_BYTES": "1000000",
            "WARMPLANE_POSTGRES__URL": parts.postgres.asyncpg_dsn,
            "WARMPLANE_ROUTING__DEPTH": str(ROUTING_DEPTH),
            "WARMPLANE_TENANT_SECRETS": json.dumps({TENANT: SECRET}),
            "WARMPLANE_LOG_LEVEL": "INFO",
        }
        processes.service("planner", "warmplane.services.planner", self._planner_env())
        self._warmer(processes, first, node="node-0", warm=True)
        self._port = free_port()
        gateway = {
            "WARMPLANE_TENANT_KEYS": json.dumps({TENANT: [API_KEY]}),
            "WARMPLANE_GATEWAY__HTTP_HOST": "127.0.0.1",
            "WARMPLANE_GATEWAY__HTTP_PORT": str(self._port),
            "WARMPLANE_GATEWAY__METRICS_PORT": "0",
            "WARMPLANE_GATEWAY__BLOCK_SIZE": str(BLOCK_SIZE),
        }
        processes.service("gateway", "warmplane.services.gateway", {**self._common, **gateway})
        wait_answered(self.url, self.headers, f"{self.name}: the first replica behind the gateway", processes)

    def _planner_env(self) -> dict[str, str]:
        if self.prefill_tokens_per_s is None:
            raise RuntimeError(f"{self.name}: no prefill rate for the planner's budget (calibrate first)")
        return {
            **self._common,
            "WARMPLANE_METRICS_PORT": "0",
            "WARMPLANE_PLANS__WINDOW_HOURS": str(10 / 60),
            "WARMPLANE_PLANS__DEADLINE_S": "240",
            "WARMPLANE_PLANS__WARM_SECONDS": str(self._warm_seconds),
            "WARMPLANE_PLANS__PREFILL_TOKENS_PER_S": str(self.prefill_tokens_per_s),
            # The alarm re-plans live replicas whose traffic looks cold: in a short run that would warm the
            # established replica too, and blur what the join alone costs.
            "WARMPLANE_COLD_START__ENABLED": "false",
        }

    def _warmer(self, processes: Processes, replica: Replica, *, node: str, warm: bool) -> None:
        engine = replica.engine
        spec = {
            "replica": replica.name,
            "url": engine.base_url,
            "served_model": MODEL,
            "block_size": BLOCK_SIZE,
            "kv_events_endpoint": engine.kv_events_endpoint,
            "kv_events_replay_endpoint": engine.kv_events_replay_endpoint,
        }
        env = {
            **self._common,
            "WARMPLANE_NODE": node,
            "WARMPLANE_ENGINES": json.dumps([spec]),
            "WARMPLANE_HTTP_HOST": "127.0.0.1",
            "WARMPLANE_HTTP_PORT": str(free_port()),
            "WARMPLANE_READINESS__WARM": "true" if warm else "false",
            "WARMPLANE_READINESS__PLAN_WAIT_S": "120",
            "WARMPLANE_WARM__HEALTH_INTERVAL_S": "0.5",
        }
        processes.service(f"warmer-{node}", "warmplane.services.warmer", env)

    async def join(self, processes: Processes, newcomer: Replica) -> None:
        assert self._kafka is not None
        scaled = FleetScaled(
            event_id=new_event_id(),
            occurred_at=datetime.now(UTC),
            producer="scaleup-bench-autoscaler",
            model=ModelRef(MODEL),
            from_replicas=1,
            to_replicas=2,
        )
        async with Emitter(self._kafka, EmitterSettings(), Topics(self._kafka.topic_prefix)) as emitter:
            emitter.emit(scaled)
        self._warmer(processes, newcomer, node="node-1", warm=self._warm)


class RouterArm:
    def __init__(self, router: str, policy: str) -> None:
        self.name = f"vllm-router-{policy.replace('_', '-')}"
        self._router, self._policy = router, policy
        self._port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def headers(self) -> dict[str, str]:
        return {}

    def start(self, processes: Processes, first: Replica) -> None:
        self._port = free_port()
        argv = [self._router, "--host", "127.0.0.1", "--port", str(self._port), "--policy", self._policy]
        argv += ["--worker-urls", first.engine.base_url, "--log-level", "warning"]
        processes.start("vllm-router", argv)
        wait_answered(self.url, self.headers, f"{self.name}: the first replica behind vllm-router", processes)

    async def join(self, processes: Processes, newcomer: Replica) -> None:
        url = newcomer.engine.base_url
        deadline = time.monotonic() + READY_TIMEOUT_S
        async with httpx.AsyncClient(timeout=10) as http:
            while not await _healthy(http, url):  # service discovery's readiness probe: the engine's /health
                processes.check()
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the newcomer's engine did not answer /health in {READY_TIMEOUT_S:.0f} s"
                    )
                await asyncio.sleep(0.5)
            added = await http.post(f"{self.url}/add_worker", params={"url": url})
            if not added.is_success:
                raise RuntimeError(
                    f"vllm-router refused the newcomer: {added.status_code} {added.text[:300]}"
                )


async def _healthy(http: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await http.get(f"{url}/health")).status_code == 200
    except httpx.HTTPError:
        return False
