"""The main job's fleet: local vLLM engines as replicas of one node, a warmer driving them, and the proof.

Replica 0 starts with the job, while the trace is replayed, and serves cold (nothing is known yet). Once
the planner has counted the trace, replica 1 is scheduled: its warmer announces it, the planner plans it
from what the trace taught, the warmer pre-fills and verifies the plan, and only then is it ready. Then
the trace's most recent requests are sent to both replicas alike (real completions, the tenant's salt),
and the cached share of their prompts is compared: the warmed replica against a cold one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import httpx
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
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, MAX_MODEL_LEN, EmbeddedVllm, ensure_tiny_model
from warmplane.shared.mooncake_trace import TraceRequest, chain_prompt
from warmplane.shared.settings import KafkaSettings

NODE = "node-0"
VOCAB = range(256, 8192)
"""Token ids the stand-in prompts use: the tiny model's vocabulary above its special tokens."""
PAYLOAD_DEPTHS = (4, 8, 16, 32, 64)
"""Chain elements whose payloads a replay publishes (the first time each is seen)."""
PROBE_DEPTH = 64
"""Blocks of a trace request a comparison request sends (its prompt: 64 x 32 = 2,048 tokens)."""


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
    """Engines (started in threads: a vLLM start blocks) and the warmer of their node."""

    def __init__(
        self, workdir: Path, model: str, kafka: KafkaSettings, tenant: str, secret: SecretStr
    ) -> None:
        self._workdir = workdir
        self._model = model
        self._tenant = tenant
        self._secret = secret
        self.engines: list[EmbeddedVllm] = []
        self._starts: list[asyncio.Task[None]] = []
        self.warmer = Warmer(
            WarmerSettings(
                kafka=kafka,
                node=NODE,
                tenant_secrets={tenant: secret},
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
        stops = [asyncio.to_thread(engine.stop) for engine in self.engines]
        failures = await asyncio.gather(*stops, return_exceptions=True)
        await asyncio.gather(*self._starts, return_exceptions=True)
        await self._stack.aclose()
        for failure in failures:
            if failure is not None:
                raise failure

    def check_starts(self) -> None:
        """Raise what stopped an engine from starting (the engine's log tail), if one did."""
        for starting in self._starts:
            if starting.done() and starting.exception() is not None:
                starting.result()

    async def schedule(self, index: int) -> ReplicaDriver:
        """Hand engine `index` to the warmer and start it, as a pod's sidecar starts beside its engine:
        the replica is announced at once and the engine loads in the background (`wait_ready`)."""
        model_dir = await asyncio.to_thread(ensure_tiny_model)
        engine = EmbeddedVllm(
            self._workdir / f"vllm-{index}",
            model_dir,
            served_model_name=self._model,
            omp_threads_bind=index % 2,
            kv_events=True,
            port=free_port(),
        )
        self.engines.append(engine)
        driver = self.warmer.add_engine(
            EngineSettings(
                replica=f"replica-{index}",
                url=engine.base_url,
                served_model=self._model,
                block_size=BLOCK_SIZE,
                kv_events_endpoint=engine.kv_events_endpoint,
                kv_events_replay_endpoint=engine.kv_events_replay_endpoint,
            )
        )
        starting = asyncio.create_task(asyncio.to_thread(engine.start), name=f"start vllm-{index}")
        self._starts.append(starting)
        return driver

    def salt(self, epoch: int = 0) -> str:
        return derive_cache_salt(self._secret, self._tenant, self._model, epoch)


async def wait_ready(
    driver: ReplicaDriver, out: TextIO, *, check: Callable[[], None], timeout_s: float = 600.0
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


def payload_depth(request: TraceRequest, seen: set[int]) -> int | None:
    """The chain depth whose payload a replayed request carries: the deepest of `PAYLOAD_DEPTHS` it
    reaches and that no earlier request carried; None if all were carried."""
    for depth in reversed(PAYLOAD_DEPTHS):
        if len(request.hash_ids) >= depth and request.hash_ids[depth - 1] not in seen:
            seen.add(request.hash_ids[depth - 1])
            return depth
    return None


async def cached_shares(
    engines: Sequence[EmbeddedVllm], model: str, requests: Sequence[TraceRequest], salt: str
) -> list[float]:
    """Send `requests` (their first `PROBE_DEPTH` blocks, as token ids) to each engine in turn, in order;
    per engine, the share of prompt tokens its prefix cache served."""
    shares = []
    for engine in engines:
        cached = total = 0
        async with httpx.AsyncClient(base_url=engine.base_url, timeout=60.0) as http:
            for request in requests:
                prompt = chain_prompt(request.hash_ids[:PROBE_DEPTH], BLOCK_SIZE, VOCAB)[: MAX_MODEL_LEN - 1]
                body = {"model": model, "prompt": prompt, "max_tokens": 1, "cache_salt": salt}
                response = await http.post("/v1/completions", json=body)
                response.raise_for_status()
                usage = response.json()["usage"]
                cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                total += usage["prompt_tokens"]
        shares.append(cached / max(total, 1))
    return shares
