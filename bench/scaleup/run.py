"""One run of one arm: fresh engines, the arm in front of them, the replay, and the join in its middle.

The established replica (r0, confined to core 0) starts cold with the run and serves the replay alone for
`before_s`; then the newcomer (r1, core 1) joins as the arm has it join, and the replay goes on for
`after_s`. The newcomer's engine is polled for the prompt tokens it computed (vLLM's prefix-cache queries
less hits), so the prefill its warm-up cost is read just before its first request. A process or engine
that dies mid-run fails the run, naming its log: a run never ends in a silent partial table.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.scaleup.arms import MODEL, Arm, Processes, Replica
from bench.scaleup.figures import RunRecord
from warmplane.services.devstack.chat_load import Sample, replay, service_times
from warmplane.services.devstack.chat_traffic import ChatRequest
from warmplane.shared.embedded.processes import free_port, log_tail
from warmplane.shared.embedded.vllm_engine import SMOLLM2_DTYPE, EmbeddedVllm

REPLICA_PREFIX = f"{MODEL}-"
LEAD_S = 1.0
"""Between the arm answering and the replay's first request."""
_COUNTER = re.compile(r"^(vllm:prefix_cache_(?:queries|hits)_total)\{[^}]*\} ([0-9.e+]+)$", re.M)


@dataclass(frozen=True, slots=True)
class RunSettings:
    before_s: float
    engine_timeout_s: float = 600.0
    kv_cache_gib: int = 4
    """Each engine's KV cache: SmolLM2 keeps about 23 KB a token, so 1 GiB holds some 46,000 tokens, about
    fifty of the replay's conversations, far less than a GPU replica holds."""


def _engine(workdir: Path, model_dir: Path, name: str, core: int, settings: RunSettings) -> Replica:
    engine = EmbeddedVllm(
        workdir / f"vllm-{name}",
        model_dir,
        served_model_name=f"{REPLICA_PREFIX}{name}",
        served_model_aliases=(MODEL,),
        omp_threads_bind=core,
        cpu_affinity=(core,),
        kv_events=True,  # the warmer's residency, as the README has a production node run it
        port=free_port(),
        kv_cache_space_gib=settings.kv_cache_gib,
        start_timeout_s=settings.engine_timeout_s,
        extra_args=("--dtype", SMOLLM2_DTYPE),  # as `make up` serves it: bfloat16 is slow without AVX512-BF16
    )
    return Replica(name, engine)


def _alive(replica: Replica) -> None:
    if not replica.engine.running:
        log = replica.engine.log_path
        raise RuntimeError(f"engine {replica.name} died mid-run: see {log}\n{log_tail(log)}")


async def computed_tokens(http: httpx.AsyncClient, url: str) -> int | None:
    """Prompt tokens the engine at `url` has computed rather than found cached; None if it does not answer."""
    try:
        text = (await http.get(f"{url}/metrics")).text
    except httpx.HTTPError:
        return None
    counters: dict[str, float] = {}
    for name, value in _COUNTER.findall(text):
        counters[name] = counters.get(name, 0.0) + float(value)
    if len(counters) < 2:
        return None
    return int(counters["vllm:prefix_cache_queries_total"] - counters["vllm:prefix_cache_hits_total"])


async def _meter(url: str, readings: list[tuple[float, int]]) -> None:
    # One client: building one (its TLS context) is CPU the replay's own loop would stall on each second.
    async with httpx.AsyncClient(timeout=5) as http:
        while True:
            if (value := await computed_tokens(http, url)) is not None:
                readings.append((time.monotonic(), value))
            await asyncio.sleep(1.0)  # a sampling period, not a wait for a condition


def _warm_tokens(
    readings: Sequence[tuple[float, int]], samples: Sequence[Sample], newcomer: str
) -> int | None:
    served = [s.sent for s in samples if s.replica == newcomer]
    if not served:
        return readings[-1][1] if readings else None
    before = [value for at, value in readings if at <= min(served)]
    return before[-1] if before else None


async def run_arm(
    arm: Arm,
    number: int,
    requests: Sequence[ChatRequest],
    *,
    model_dir: Path,
    settings: RunSettings,
    keep: Path,
) -> RunRecord:
    """Run `arm` once over `requests`; the engines' and services' logs are kept under `keep`."""
    with tempfile.TemporaryDirectory(prefix="wp-scaleup-") as folder, ExitStack() as stack:
        workdir = Path(folder)
        stack.callback(_keep_logs, workdir, keep / f"run{number}-{arm.name}")
        processes = Processes(stack, workdir)
        first = _engine(workdir, model_dir, "r0", 0, settings)
        newcomer = _engine(workdir, model_dir, "r1", 1, settings)
        stack.callback(newcomer.engine.stop)
        await asyncio.to_thread(stack.enter_context, first.engine)
        await asyncio.to_thread(arm.start, processes, first)
        for replica in (first, newcomer):
            processes.part(f"engine {replica.name}", lambda engine=replica.engine: engine.pid)  # type: ignore[misc]
        cpu_before = processes.cpu_seconds()
        start = time.monotonic() + LEAD_S
        traffic = asyncio.create_task(
            replay(
                arm.url,
                requests,
                model=MODEL,
                replica_prefix=REPLICA_PREFIX,
                headers=arm.headers,
                start=start,
            )
        )
        while (wait := start + settings.before_s - time.monotonic()) > 0:
            processes.check()
            _alive(first)
            await asyncio.sleep(min(wait, 1.0))
        join = time.monotonic()
        starting = asyncio.create_task(asyncio.to_thread(newcomer.engine.start))
        await arm.join(processes, newcomer)
        readings: list[tuple[float, int]] = []
        meter = asyncio.create_task(_meter(newcomer.engine.base_url, readings))
        try:
            while not traffic.done():
                processes.check()
                _alive(first)
                if starting.done():
                    starting.result()  # raises what stopped the engine from starting
                    _alive(newcomer)
                await asyncio.wait({traffic}, timeout=1.0)
        finally:
            meter.cancel()
            if not traffic.done():
                traffic.cancel()
        samples = traffic.result()
        cpu_after = processes.cpu_seconds()
        await starting
        end = start + (requests[-1].at_s if requests else 0.0)
        return RunRecord(
            arm=arm.name,
            run=number,
            join=join,
            end=end,
            newcomer=newcomer.name,
            samples=samples,
            warm_tokens=_warm_tokens(readings, samples, newcomer.name),
            cpu_s={name: used - cpu_before.get(name, 0.0) for name, used in cpu_after.items()},
        )


@dataclass(frozen=True, slots=True)
class Calibration:
    service_s: float
    """Mean seconds one request costs the engine alone (to its last chunk). The mean, not the median: a
    replica's load is its arrival rate times its mean service time, and the trace's prompt lengths are
    skewed, so the median understates it."""
    prefill_tokens_per_s: float
    """Prompt tokens the engine computed (not found cached) per second to the first token, over the
    requests: the rate the planner's warm budget converts seconds with."""
    requests: int

    @classmethod
    def of(cls, timed: Sequence[tuple[float, Sample]]) -> Calibration:
        """From each request's seconds alone beside its sample (`service_times`)."""
        if not timed:
            raise ValueError("a calibration needs at least one request")
        computed = sum(sample.prompt_tokens - sample.cached_tokens for _, sample in timed)
        prefill_s = sum(sample.ttft or 0.0 for _, sample in timed)
        return cls(
            service_s=statistics.fmean(seconds for seconds, _ in timed),
            prefill_tokens_per_s=computed / prefill_s if prefill_s > 0 else 0.0,
            requests=len(timed),
        )

    def sample(self, full_rate: float, utilization: float) -> float:
        """The share of conversations whose rate loads one replica to `utilization` of its one-at-a-time
        capacity, given the trace slice's full rate (requests/s)."""
        return min(1.0, utilization / self.service_s / full_rate)


async def calibrate(
    requests: Sequence[ChatRequest], *, model_dir: Path, settings: RunSettings
) -> Calibration:
    """Time `requests` one after another on a lone fresh engine (core 0), as the established replica is."""
    with tempfile.TemporaryDirectory(prefix="wp-scaleup-calibrate-") as folder:
        replica = _engine(Path(folder), model_dir, "r0", 0, settings)
        with replica.engine:
            return Calibration.of(await service_times(replica.engine.base_url, requests, model=MODEL))


def _keep_logs(workdir: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for log in workdir.rglob("*.log"):
        target = into / "-".join(log.relative_to(workdir).parts)
        target.write_bytes(log.read_bytes()[-2_000_000:])
