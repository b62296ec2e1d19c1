"""Warm speed: how close a plan run comes to the engine's own peak prefill, and how fast a plan reaches
the warmer after a replica announces itself. Run:

    python -m bench.warm_bench [--runs 3] [--items 48] [--item-tokens 1024] [--starts 100] [--replicas 100]
    python -m bench.warm_bench --endpoint http://gpu-host:8000 --model NAME --block-size 16 ...

Without `--endpoint` it starts the embedded vLLM (CPU build, tiny model, 32-token blocks) and stops it
after; with one it measures that engine, whatever it is (a GPU build of vLLM anywhere reachable).

(1) Peak prefill: `--items` distinct prompts of `--item-tokens` random token ids, each under a fresh
`cache_salt` (nothing cached), sent at 1, 2, 4, 8 and 16 in flight with `max_tokens=1`; prompt tokens
over wall time; the best rate is the peak. (2) Plan runs: a `PlanRun` (the warmer's own code: warm pass,
then probe pass) of the same shape, fresh prompts and salt each run, at the warmer's default concurrency.
Ratio = wall time / (tokens pre-filled / peak rate); 1.0 means the warmer adds nothing to the engine's
prefill time. The warm pass alone is shown beside it (the probe pass is the price of verification).
(3) Plan latency, on the embedded broker and Postgres with a real planner and warmer: replicas of this
engine are announced `--starts` times one after the other, then `--replicas` at once (a scale-up), and
for each, the time from its `replica.started` to the warmer holding its plan
(`ReplicaDriver.plan_latency_s`). Medians across runs, p50/p99 of latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from pydantic import SecretStr

from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.settings import IngestSettings, PlannerSettings
from warmplane.services.warmer.core.replica import RunOrder
from warmplane.services.warmer.plan_run import PlanRun
from warmplane.services.warmer.replica_driver import fits_easily
from warmplane.services.warmer.service import Warmer
from warmplane.services.warmer.settings import (
    EngineSettings,
    ReadinessSettings,
    WarmerSettings,
    WarmSettings,
)
from warmplane.services.warmer.vllm_client import VllmEngineClient
from warmplane.shared import migrate
from warmplane.shared.cache_salt import SaltBook
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, EmbeddedVllm, ensure_tiny_model
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, PrefixPayload, WarmItem, WarmPlanIssued
from warmplane.shared.settings import KafkaSettings, PostgresSettings

VOCAB = range(256, 8192)
CONCURRENCIES = (1, 2, 4, 8, 16)


@dataclass(frozen=True, slots=True)
class Engine:
    url: str
    model: str
    block_size: int


def prompts(rng: random.Random, count: int, tokens: int, vocab: range) -> list[list[int]]:
    return [rng.choices(vocab, k=tokens) for _ in range(count)]


async def prefill_rate(engine: Engine, batch: Sequence[list[int]], concurrency: int) -> float:
    """Prompt tokens a second for `batch`, uncached (a fresh salt), at `concurrency` in flight."""
    salt = uuid.uuid4().hex
    limit = asyncio.Semaphore(concurrency)
    total = 0

    async def one(http: httpx.AsyncClient, prompt: list[int]) -> None:
        nonlocal total
        body = {"model": engine.model, "prompt": prompt, "max_tokens": 1, "cache_salt": salt}
        async with limit:
            response = await http.post("/v1/completions", json=body)
        response.raise_for_status()
        usage = response.json()["usage"]
        assert not (usage.get("prompt_tokens_details") or {}).get("cached_tokens"), "expected a cold prompt"
        total += usage["prompt_tokens"]

    async with httpx.AsyncClient(base_url=engine.url, timeout=300.0) as http:
        began = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for prompt in batch:
                group.create_task(one(http, prompt))
        return total / (time.perf_counter() - began)


async def plan_run(engine: Engine, batch: Sequence[list[int]], concurrency: int) -> tuple[float, float, int]:
    """(wall seconds, warm-pass seconds, tokens pre-filled) of the warmer's `PlanRun` over `batch`."""
    secret = SecretStr(uuid.uuid4().hex)
    items = [
        WarmItem(i, len(prompt), PrefixPayload(prefix_id=i, prompt=prompt), "bench")
        for i, prompt in enumerate(batch)
    ]
    now = datetime.now(UTC)
    plan = WarmPlanIssued(
        event_id=new_event_id(),
        occurred_at=now,
        producer="bench",
        model=ModelRef(engine.model),
        plan_id=new_event_id(),
        replica="bench",
        node="bench",
        epoch=0,
        items=items,
        budget_tokens=sum(item.tokens for item in items),
        deadline=now + timedelta(hours=1),
    )
    order = RunOrder(plan, items, 0, concurrency, [])
    async with VllmEngineClient(
        engine.url, engine.model, connect_timeout_s=5, request_timeout_s=300, block_size=engine.block_size
    ) as client:
        warm = WarmSettings()
        run = PlanRun(
            order,
            client,
            SaltBook({"bench": secret}),
            priority=warm.priority,
            attempts=1,
            probe_concurrency=warm.probe_concurrency,
            verify_each=fits_easily(order, await client.kv_capacity_tokens()),
        )
        began = time.perf_counter()
        report = await run.run()
        wall = time.perf_counter() - began
    if len(report.verified) != len(items):
        raise RuntimeError(f"only {len(report.verified)} of {len(items)} verified: {report.failures[:3]}")
    return wall, run.warm_pass_s or wall, report.tokens_prefilled


@contextlib.asynccontextmanager
async def control_plane(workdir: Path) -> AsyncIterator[KafkaSettings]:
    """The embedded broker and Postgres, migrated, with a planner running; the Kafka settings."""
    with EmbeddedKafka(workdir / "kafka") as kafka_part, EmbeddedPostgres(workdir / "postgres") as postgres:
        await asyncio.to_thread(migrate.upgrade, postgres.sqlalchemy_url)
        kafka = KafkaSettings(
            bootstrap_servers=kafka_part.bootstrap_servers,
            session_timeout_ms=2_000,
            heartbeat_interval_ms=500,
        )
        settings = PlannerSettings(
            kafka=kafka,
            postgres=PostgresSettings(url=SecretStr(postgres.asyncpg_dsn)),
            ingest=IngestSettings(),
            metrics_port=0,
        )
        async with running_planner(settings):
            yield kafka


async def plan_latencies(engine: Engine, kafka: KafkaSettings, *, rounds: int, at_once: int) -> list[float]:
    """Announce `at_once` replicas of `engine` together, `rounds` times one round after the other; each
    replica's seconds from its `replica.started` to the warmer holding its plan."""
    settings = WarmerSettings(
        kafka=kafka,
        node=f"bench-{uuid.uuid4().hex[:6]}",
        warm=WarmSettings(health_interval_s=5.0),
        readiness=ReadinessSettings(plan_wait_s=600),
        http_host="127.0.0.1",
        http_port=0,
    )
    latencies: list[float] = []
    async with Warmer(settings) as warmer:
        for round_ in range(rounds):
            drivers = [
                warmer.add_engine(
                    EngineSettings(
                        replica=f"{settings.node}-{round_}-{i}",
                        url=engine.url,
                        served_model=engine.model,
                        block_size=engine.block_size,
                    )
                )
                for i in range(at_once)
            ]
            deadline = time.monotonic() + 120
            while any(driver.plan_latency_s is None for driver in drivers):
                if time.monotonic() > deadline:
                    missing = sum(driver.plan_latency_s is None for driver in drivers)
                    raise RuntimeError(f"{missing} of {at_once} replicas got no plan in 120 s")
                await asyncio.sleep(0.01)
            latencies += [driver.plan_latency_s or 0.0 for driver in drivers]
    return latencies


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _spread(seconds: Sequence[float]) -> str:
    ms = [1000 * value for value in seconds]
    return f"p50 {percentile(ms, 0.5):.0f} ms, p99 {percentile(ms, 0.99):.0f} ms, max {max(ms):.0f} ms"


async def bench(engine: Engine, args: argparse.Namespace, workdir: Path, recorder: SummaryRecorder) -> None:
    rng = random.Random(args.seed)
    vocab = VOCAB if args.endpoint is None else range(1000, 20_000)
    concurrency = WarmSettings().concurrency
    peaks, walls, warms, ideals, ratios, warm_ratios = [], [], [], [], [], []
    for run in range(1, args.runs + 1):
        rates = {
            c: await prefill_rate(engine, prompts(rng, args.items, args.item_tokens, vocab), c)
            for c in CONCURRENCIES
        }
        peak = max(rates.values())
        wall, warm, prefilled = await plan_run(
            engine, prompts(rng, args.items, args.item_tokens, vocab), concurrency
        )
        ideal = prefilled / peak
        peaks.append(peak)
        walls.append(wall)
        warms.append(warm)
        ideals.append(ideal)
        ratios.append(wall / ideal)
        warm_ratios.append(warm / ideal)
        shown = ", ".join(f"{c}: {rate:,.0f}" for c, rate in rates.items())
        print(
            f"run {run}: prefill tokens/s by concurrency {{{shown}}}; "
            f"plan of {args.items} x {args.item_tokens} tokens at {concurrency} in flight: {wall:.2f} s "
            f"({warm:.2f} s warm pass), {prefilled:,} tokens pre-filled, ideal {ideal:.2f} s "
            f"-> ratio {wall / ideal:.2f} (warm pass {warm / ideal:.2f})"
        )
    async with control_plane(workdir) as kafka:
        singles = await plan_latencies(engine, kafka, rounds=args.starts, at_once=1)
        bursts: list[float] = []
        for _ in range(args.runs):
            bursts += await plan_latencies(engine, kafka, rounds=1, at_once=args.replicas)
    median = statistics.median
    print(
        f"\nmedians of {args.runs} runs: peak prefill {median(peaks):,.0f} tokens/s; "
        f"plan wall {median(walls):.2f} s, warm pass {median(warms):.2f} s; "
        f"ratio to ideal {median(ratios):.2f} (target <= 1.2), warm pass alone {median(warm_ratios):.2f}\n"
        f"replica.started -> plan at the warmer, one start at a time ({len(singles)} starts): "
        f"{_spread(singles)} (target p99 <= 200 ms)\n"
        f"  {args.replicas} replicas starting together ({args.runs} bursts): {_spread(bursts)}"
    )
    runs = (walls, warms, ideals, ratios, warm_ratios)
    _summarise(recorder, args, peaks=peaks, runs=runs, singles=singles, bursts=bursts)


def _summarise(
    recorder: SummaryRecorder,
    args: argparse.Namespace,
    *,
    peaks: list[float],
    runs: tuple[list[float], list[float], list[float], list[float], list[float]],
    singles: list[float],
    bursts: list[float],
) -> None:
    """The printed medians as the bench's summary: the plan run against its ideal at peak prefill, and
    the latencies from a replica's start to its plan (no baseline: their target is 200 ms at p99)."""
    median = statistics.median
    walls, warms, ideals, ratios, warm_ratios = runs
    ideal = ("tokens pre-filled at the engine's peak prefill rate", median(ideals))
    recorder.figure("plan run (warm pass, then probes), wall time", median(walls), "s", ideal, median(ratios))
    recorder.figure("warm pass alone, wall time", median(warms), "s", ideal, median(warm_ratios))
    recorder.figure("engine's peak prefill", median(peaks), "tokens/s")
    ms = [1000 * value for value in singles]
    together = [1000 * value for value in bursts]
    recorder.figure(
        "replica.started -> plan at the warmer, one start at a time, p50", percentile(ms, 0.5), "ms"
    )
    recorder.figure(
        "replica.started -> plan at the warmer, one start at a time, p99", percentile(ms, 0.99), "ms"
    )
    recorder.figure(
        f"replica.started -> plan at the warmer, {args.replicas} starting together, p99",
        percentile(together, 0.99),
        "ms",
    )
    recorder.note(
        "Ratios are medians of each run's wall time / ideal time (tokens pre-filled / that run's peak rate),"
        " as the bench prints them: 1.0 means the warmer adds nothing to the engine's prefill time; target"
        " <= 1.2. The latencies' target is p99 <= 200 ms; they are p50 and p99 over all starts, not medians"
        f" of runs ({len(singles)} single starts, {args.runs} bursts of {args.replicas})."
    )
    recorder.table(
        "Each run: peak prefill, the plan run, its ideal at that peak, the ratios.",
        ["run", "peak tokens/s", "plan wall s", "warm pass s", "ideal s", "ratio", "warm pass ratio"],
        [
            [
                i + 1,
                f"{peaks[i]:,.0f}",
                *(f"{values[i]:.2f}" for values in (walls, warms, ideals, ratios, warm_ratios)),
            ]
            for i in range(len(peaks))
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--endpoint", help="a vLLM OpenAI-compatible server (default: start the embedded one)"
    )
    parser.add_argument("--model", help="its served model name (required with --endpoint)")
    parser.add_argument("--block-size", type=int, default=16, help="its KV block size (with --endpoint)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--items", type=int, default=48, help="prompts per prefill measurement and per plan")
    parser.add_argument("--item-tokens", type=int, default=1024)
    parser.add_argument("--starts", type=int, default=100, help="replicas announced one after the other")
    parser.add_argument("--replicas", type=int, default=100, help="replicas announced together, per burst")
    parser.add_argument("--seed", type=int, default=7)
    add_summary_option(parser)
    args = parser.parse_args()
    recorder = SummaryRecorder(
        bench="warm",
        title="Warm speed against the engine's peak prefill; a replica's start to its plan at the warmer",
        module="bench.warm_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=args.runs,
    )
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="warmplane-warm-bench-") as folder:
        workdir = Path(folder)
        if args.endpoint is not None:
            if not args.model:
                parser.error("--model is required with --endpoint")
            engine = Engine(args.endpoint.rstrip("/"), args.model, args.block_size)
            asyncio.run(bench(engine, args, workdir, recorder))
        else:
            with EmbeddedVllm(workdir / "vllm", ensure_tiny_model()) as vllm:
                engine = Engine(vllm.base_url, vllm.model_name, BLOCK_SIZE)
                asyncio.run(bench(engine, args, workdir, recorder))
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
