"""The development stack's fleet: local vLLM engines as the replicas of one node, and the warmer driving them.

A replica is scheduled as a pod with its sidecar is: the warmer announces it at once and drives it while
its engine loads in a thread (a vLLM start blocks), so the planner can plan it meanwhile. The engines serve
SmolLM2-135M-Instruct, a real small model, on the CPU build. `cold_reference` starts one more engine of the
same model that no warmer knows: the baseline a warmed newcomer is compared with.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from pydantic import SecretStr

from warmplane.services.warmer.core.replica import Phase
from warmplane.services.warmer.replica_driver import ReplicaDriver
from warmplane.services.warmer.service import Warmer
from warmplane.services.warmer.settings import (
    EngineSettings,
    ReadinessSettings,
    WarmerSettings,
    WarmSettings,
)
from warmplane.shared.cache_salt import derive_cache_salt
from warmplane.shared.embedded.processes import free_port
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, SMOLLM2_DTYPE, EmbeddedVllm
from warmplane.shared.settings import KafkaSettings

NODE = "node-0"
COLD_REFERENCE = "cold-reference"
START_TIMEOUT_S = 900.0
"""A CPU engine starts in about a minute on a quiet 2-core machine, five times that on a busy one."""
KV_CACHE_GIB = 2
"""Each engine's KV cache: SmolLM2 keeps about 23 KB a token, so some 90,000 tokens, more than a plan."""


@dataclass(frozen=True, slots=True)
class WarmSummary:
    prefixes_warmed: int
    verified: int
    tokens_prefilled: int
    seconds_to_ready: float
    """From scheduling (the engine starting) to ready."""
    seconds_warming: float
    """From the engine answering to ready: planning, warming and verifying."""
    partial: bool
    reason: str
    failures: int


class Fleet:
    """Engines of `model_dir` served as `model` (started in threads: a vLLM start blocks) and the warmer of
    their node; the tenant's secret derives the salt its warm-ups carry, as the gateway's traffic does."""

    def __init__(
        self,
        workdir: Path,
        *,
        model: str,
        model_dir: Path,
        kafka: KafkaSettings,
        tenant: str,
        secret: SecretStr,
        event_key: SecretStr,
    ) -> None:
        self._workdir = workdir
        self.model = model
        self._model_dir = model_dir
        self._tenant = tenant
        self._secret = secret
        self.engines: dict[str, EmbeddedVllm] = {}
        self._starts: dict[str, asyncio.Task[None]] = {}
        self.warmer = Warmer(
            WarmerSettings(
                kafka=kafka,
                node=NODE,
                tenant_secrets={tenant: secret},
                event_keys=[event_key],
                warm=WarmSettings(health_interval_s=0.5, progress_interval_s=0.5),
                readiness=ReadinessSettings(plan_wait_s=60),
                http_host="127.0.0.1",
                http_port=0,
            )
        )
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Fleet:
        await self.warmer.start()
        self._stack.push_async_callback(self.warmer.stop)
        return self

    async def __aexit__(self, *exc: object) -> None:
        # A start under way runs in a thread that cannot be cancelled; stopping its engine ends it at once
        # (the start fails), where waiting for it could take the whole start timeout. Stops run side by
        # side: each waits for vLLM's graceful exit, a few seconds.
        stops = [asyncio.to_thread(engine.stop) for engine in self.engines.values()]
        failures = await asyncio.gather(*stops, return_exceptions=True)
        await asyncio.gather(*self._starts.values(), return_exceptions=True)
        await self._stack.aclose()
        for failure in failures:
            if failure is not None:
                raise failure

    @property
    def replicas(self) -> int:
        """Replicas scheduled so far (the cold reference is none of them)."""
        return len(self.warmer.drivers)

    def check_starts(self) -> None:
        """Raise what stopped an engine from starting (the engine's log tail), if one did."""
        for starting in self._starts.values():
            if starting.done() and starting.exception() is not None:
                starting.result()

    def schedule(self) -> ReplicaDriver:
        """Hand the next replica's engine to the warmer and start it: the replica is announced at once and
        the engine loads in the background (`wait_ready`). Engines are confined to one core each,
        alternating (two cores here)."""
        replica = f"replica-{self.replicas}"
        engine = self._engine(replica, core=self.replicas % 2)
        return self.warmer.add_engine(engine_settings(engine, replica))

    def cold_reference(self) -> EmbeddedVllm:
        """Start an engine of the same model that no warmer drives and no router knows: cold by
        construction. Returns at once; `started` waits for it. It shares replica-0's core: start it when
        replica-0 is idle (an engine busy-waits for its core, and two busy on one core run at a tenth of
        their speed)."""
        return self._engine(COLD_REFERENCE, core=0)

    def _engine(self, name: str, *, core: int) -> EmbeddedVllm:
        engine = EmbeddedVllm(
            self._workdir / f"vllm-{name}",
            self._model_dir,
            served_model_name=self.model,
            omp_threads_bind=core,
            cpu_affinity=(core,),
            kv_cache_space_gib=KV_CACHE_GIB,
            kv_events=True,
            port=free_port(),
            start_timeout_s=START_TIMEOUT_S,
            extra_args=("--dtype", SMOLLM2_DTYPE),
        )
        self.engines[name] = engine
        self._starts[name] = asyncio.create_task(asyncio.to_thread(engine.start), name=f"start {name}")
        return engine

    async def started(self, name: str) -> EmbeddedVllm:
        """Engine `name` once it answers; raises what stopped it from starting (its log's tail)."""
        await asyncio.shield(self._starts[name])
        return self.engines[name]

    async def stop_engine(self, name: str) -> None:
        """Stop engine `name` (the cold reference once it has served its purpose)."""
        engine = self.engines.pop(name)
        await asyncio.to_thread(engine.stop)
        await asyncio.gather(self._starts.pop(name), return_exceptions=True)

    def salt(self, epoch: int = 0) -> str:
        return derive_cache_salt(self._secret, self._tenant, self.model, epoch)


def engine_settings(engine: EmbeddedVllm, replica: str) -> EngineSettings:
    """How a warmer on the engine's own host drives `engine` as replica `replica`: by its URL and first
    served name, at the embedded engines' block size, following its KV events."""
    return EngineSettings(
        replica=replica,
        url=engine.base_url,
        served_model=engine.model_name,
        block_size=BLOCK_SIZE,
        kv_events_endpoint=engine.kv_events_endpoint,
        kv_events_replay_endpoint=engine.kv_events_replay_endpoint,
    )


async def wait_ready(
    driver: ReplicaDriver, out: TextIO, *, check: Callable[[], None], timeout_s: float = 900.0
) -> WarmSummary:
    """Show the replica's phase and warm progress until it is ready (on a terminal, one line rewritten;
    otherwise a line per phase and at most one every 10 s); what its warm achieved. `check()` raises what
    went wrong elsewhere (an engine that failed to start)."""
    tty = out.isatty()
    began = time.monotonic()
    shown, shown_at, phase = "", 0.0, ""
    loaded_at: float | None = None
    while True:
        check()
        tracker = driver.tracker
        if loaded_at is None and tracker.phase not in (Phase.STARTING, Phase.FAILED):
            loaded_at = time.monotonic()
        if tracker.phase is Phase.FAILED or time.monotonic() - began > timeout_s:
            raise RuntimeError(f"{driver.replica} did not turn ready: {tracker.reason}")
        line = f"  {driver.replica}: {tracker.phase} ({time.monotonic() - began:.0f} s)"
        report = driver.progress()
        if report is not None and tracker.running is not None:
            line += (
                f": {report.items_done} of {report.items_total} prefixes done, "
                f"{report.tokens_prefilled:,} tokens pre-filled, {len(report.verified)} verified"
            )
        now = time.monotonic()
        if tracker.ready or (line != shown and (tty or tracker.phase != phase or now - shown_at >= 10)):
            out.write(("\r" + line.ljust(len(shown))) if tty else line + "\n")
            out.flush()
            shown, shown_at, phase = line, now, tracker.phase
        if tracker.ready:
            break
        await asyncio.sleep(0.1)
    if tty:
        out.write("\n")
    report = driver.last_report
    return WarmSummary(
        prefixes_warmed=0 if report is None else report.items_total,
        verified=0 if report is None else len(report.verified) + report.already_held,
        tokens_prefilled=0 if report is None else report.tokens_prefilled,
        seconds_to_ready=time.monotonic() - began,
        seconds_warming=time.monotonic() - (loaded_at or began),
        partial=driver.tracker.partial,
        reason=driver.tracker.reason,
        failures=0 if report is None else len(report.failures),
    )
