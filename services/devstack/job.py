"""`warmplane up`: the main job on its embedded defaults, from nothing to a warm replica, a proof in time to
first token, and the whole product left up to try.

1. The broker, PostgreSQL and Redis start from their wheels and are migrated; the planner, a node's
   warmer, the gateway and the API start in this process, with generated credentials (`product`).
2. replica-0 (SmolLM2-135M-Instruct on vLLM's CPU build) starts before any traffic is known: it serves
   cold.
3. The history (`history`): a recorded trace's older requests are published as request events, its last
   minute is sent as real chat traffic through the gateway to replica-0. The planner counts both.
4. A scale-up, as a person or an autoscaler asks for one: `fleet.scaled` through the API, the
   development autoscaler (`autoscaler`) starts replica-1, its warmer announces it, the planner plans it,
   the warmer pre-fills and verifies the plan, and only then is it ready. Then a cold engine of the same
   model starts on replica-0's core (idle by then: an engine busy-waits for its core).
5. The proof (`proof`): the trace's next requests that routing sends to replica-1, sent to it and to the
   cold engine, time to first token and cached share side by side.
6. What to paste to try it: a request through the gateway, the status page, the CLI's settings. With
   `--keep-running` everything stays up until a signal; `warmplane scale` starts more replicas.
Everything it started is stopped on the way out, a signal included (`stop_signals`).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import asyncpg
import httpx
from pydantic import SecretStr

from warmplane.services.devstack import proof
from warmplane.services.devstack.autoscaler import DevAutoscaler
from warmplane.services.devstack.chat_load import Sample
from warmplane.services.devstack.chat_traffic import vocabulary_words
from warmplane.services.devstack.fleet import COLD_REFERENCE, Fleet, WarmSummary, wait_ready
from warmplane.services.devstack.history import (
    LIVE_CONCURRENCY,
    LIVE_S,
    History,
    publish_recorded,
    send_live,
    split_history,
)
from warmplane.services.devstack.product import Credentials, Product
from warmplane.services.gateway.settings import RoutingSettings
from warmplane.services.planner.app import Planner, build_planner
from warmplane.services.planner.gc_tuning import tune_for_batches
from warmplane.services.planner.settings import (
    ColdStartSettings,
    IngestSettings,
    PlannerSettings,
    PlanRingSettings,
    PlanSettings,
)
from warmplane.shared import migrate
from warmplane.shared.embedded import EmbeddedStack
from warmplane.shared.embedded.vllm_engine import ensure_smollm2
from warmplane.shared.emitter import Emitter
from warmplane.shared.mooncake_trace import read_trace
from warmplane.shared.settings import EmitterSettings, KafkaSettings, PostgresSettings
from warmplane.shared.topics import Topics
from warmplane.shared.traces import CONVERSATION, trace_path

DEFAULT_TRACE = trace_path(CONVERSATION)
MODEL = "smollm2"
TENANT = "demo"
HISTORY = 10_000
"""Requests of the trace the stack learns from before replica-1 joins (about 50 minutes of it)."""
PLAN_WINDOW_MINUTES = 60
# A plan's deadline runs from its issue, when the warmer announces the replica, so it includes the
# engine's start-up: about 60 s for the CPU build on a quiet 2-core machine, twice that when it is busy.
PLAN_DEADLINE_S = 600.0
WARM_SECONDS = 90.0
PREFILL_TOKENS_PER_S = 150.0
"""SmolLM2's cold prefill in float32 on one core of an AVX2-only 2-core machine, about (`SMOLLM2_DTYPE`;
`bench.scaleup` calibrates its own per run): a plan costs at most `WARM_SECONDS` of it."""
ROUTING_DEPTH = 1
"""The conversation trace's requests share their first block, so they are routed by their second (the
trace evaluator's automatic depth); the planner plans each replica for that share of the ring."""
PLAN_EVENT_BYTES = 1_000_000
"""Room for a plan of long prompts in one event (Kafka's default message limit is about 1 MB)."""
COUNT_TIMEOUT_S = 180.0
MIN_TAIL = 1_000
"""Requests after the history: the proof takes the first `proof.COMPARED` that routing gives replica-1."""


class TraceTooShort(ValueError):
    """The trace holds too few requests after the history for the proof."""


@dataclass(frozen=True, slots=True)
class _Run:
    """What the job's steps share."""

    history: History
    words: Sequence[str]
    fleet: Fleet
    autoscaler: DevAutoscaler
    product: Product
    planner: Planner
    kafka: KafkaSettings
    routing: RoutingSettings
    out: TextIO


@dataclass(frozen=True, slots=True)
class UpOptions:
    trace: Path
    limit: int | None
    """The history's size in requests (default `HISTORY`); the rest of the trace is its tail."""
    workdir: Path | None
    keep_running: bool
    top: int = 10
    credentials: Credentials | None = None
    """What `--credentials FILE` pins; None: all generated."""


async def run_up(options: UpOptions, out: TextIO) -> None:
    """Run the main job; raise `FileNotFoundError` if the trace is missing, a `ValueError` if it is too
    short for the history asked for (`TraceTooShort`)."""
    trace = options.trace.resolve()
    if not trace.is_file():
        raise FileNotFoundError(f"no trace at {trace}: pass one with --trace")
    with contextlib.ExitStack() as exits:
        workdir = options.workdir or Path(
            exits.enter_context(tempfile.TemporaryDirectory(prefix="warmplane-"))
        )
        model_dir = await asyncio.to_thread(ensure_smollm2)
        words = vocabulary_words(model_dir / "tokenizer.json")
        history = split_history(list(read_trace(trace)), options.limit or HISTORY, words)
        if len(history.tail) < MIN_TAIL:
            raise TraceTooShort(
                f"{trace} has {len(history.tail)} requests after the first {options.limit or HISTORY:,}: "
                f"the proof needs at least {MIN_TAIL:,}; pass a smaller --limit"
            )
        began = time.perf_counter()
        stack = exits.enter_context(EmbeddedStack(workdir))
        out.write(
            f"started in {time.perf_counter() - began:.1f} s: Kafka-protocol broker "
            f"{stack.kafka.bootstrap_servers}, PostgreSQL 18 {stack.postgres.dsn}, Redis {stack.redis.url}\n"
        )
        await asyncio.to_thread(migrate.upgrade, stack.postgres.sqlalchemy_url)
        kafka = KafkaSettings(
            bootstrap_servers=stack.kafka.bootstrap_servers,
            session_timeout_ms=2_000,
            heartbeat_interval_ms=500,
            max_event_bytes=PLAN_EVENT_BYTES,
        )
        postgres = PostgresSettings(url=stack.postgres.asyncpg_dsn)
        tune_for_batches()
        credentials = options.credentials or Credentials()
        planner = build_planner(_planner_settings(kafka, postgres, credentials.event_key))
        task = asyncio.create_task(planner.serve(), name="planner")
        routing = RoutingSettings(depth=ROUTING_DEPTH)
        try:
            async with (
                Fleet(
                    workdir,
                    model=MODEL,
                    model_dir=model_dir,
                    kafka=kafka,
                    tenant=TENANT,
                    secret=credentials.tenant_secret,
                    event_key=credentials.event_key,
                ) as fleet,
                DevAutoscaler(fleet, kafka) as autoscaler,
                Product(credentials, TENANT, kafka, postgres, routing) as product,
            ):
                run = _Run(history, words, fleet, autoscaler, product, planner, kafka, routing, out)
                await _learn(run)
                await _summarise(stack.postgres.asyncpg_dsn, options.top, out)
                await _join_and_prove(run)
                out.write("\n")
                product.show(MODEL, out)
                out.write(f"warmer status at http://127.0.0.1:{fleet.warmer.http_port}/status\n")
                if options.keep_running:
                    out.write("running; Ctrl-C stops everything\n")
                    out.flush()
                    await _until_stopped(task, autoscaler, fleet, out)
        finally:
            planner.exit()
            async with asyncio.timeout(30):
                await task


def _planner_settings(
    kafka: KafkaSettings, postgres: PostgresSettings, event_key: SecretStr
) -> PlannerSettings:
    return PlannerSettings(
        kafka=kafka,
        postgres=postgres,
        event_keys=[event_key],
        ingest=IngestSettings(),
        plans=PlanSettings(
            window_hours=PLAN_WINDOW_MINUTES / 60,
            deadline_s=PLAN_DEADLINE_S,
            warm_seconds=WARM_SECONDS,
            prefill_tokens_per_s=PREFILL_TOKENS_PER_S,
        ),
        routing=PlanRingSettings(depth=ROUTING_DEPTH),
        # The recorded events carry no cache figures (every request looks cold): the alarm would re-plan
        # replica-0 while it serves the live minute, and blur what the scale-up shows.
        cold_start=ColdStartSettings(enabled=False),
        metrics_port=0,
    )


async def _learn(run: _Run) -> None:
    """replica-0 up and routed to; the history published and sent; until the planner has counted it."""
    fleet, product, history, kafka, out = run.fleet, run.product, run.history, run.kafka, run.out
    out.write("scheduling replica-0 (SmolLM2-135M-Instruct on vLLM's CPU build) before any traffic\n")
    driver = fleet.schedule()
    first = await wait_ready(driver, out, check=fleet.check_starts)
    out.write(f"replica-0 is ready: {first.reason}\n")
    await _routable(product, 1)
    began = time.perf_counter()
    async with Emitter(kafka, EmitterSettings(), Topics(kafka.topic_prefix)) as emitter:
        recorded = await publish_recorded(history.recorded, run.words, emitter, tenant=TENANT, model=MODEL)
    await _counted(run.planner, recorded)  # the planner's ingest is not to share the CPU with the live minute
    out.write(
        f"\n{recorded:,} recorded requests published as request events and counted in "
        f"{time.perf_counter() - began:.1f} s; the history's last minute ({len(history.live)} requests) "
        f"goes through the gateway to replica-0, {LIVE_CONCURRENCY} at a time\n"
    )
    out.flush()
    api_key = product.credentials.api_key.get_secret_value()
    samples = await send_live(product.gateway_url, api_key, history.live, MODEL)
    _show_live(samples, out)
    answered = sum(1 for s in samples if s.status == 200)
    await _counted(run.planner, recorded + answered)


def _show_live(samples: Sequence[Sample], out: TextIO) -> None:
    answered = [s for s in samples if s.status == 200 and s.ttft is not None]
    failed = [s for s in samples if s.status != 200]
    if not answered:
        raise RuntimeError(f"no live request was answered: {failed[0].status} {failed[0].error}")
    seen = proof.Side.of(answered)
    out.write(
        f"  {len(samples)} sent in {LIVE_S:.0f} s, {len(answered)} answered by replica-0: TTFT p50 "
        f"{seen.p50_ms:.0f} ms, p90 {seen.p90_ms:.0f} ms; {seen.cached_share:.1%} of prompt tokens served "
        "from its prefix cache\n"
    )
    if failed:
        out.write(f"  {len(failed)} failed, the first with {failed[0].status} {failed[0].error}\n")


async def _counted(planner: Planner, expected: int) -> None:
    deadline = time.monotonic() + COUNT_TIMEOUT_S
    while (counted := planner.metrics.events_ingested("request.observed")) < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the planner counted {counted} of {expected} events in {COUNT_TIMEOUT_S:.0f} s"
            )
        await asyncio.sleep(0.1)


async def _routable(product: Product, replicas: int, timeout_s: float = 60.0) -> None:
    """Until the gateway routes to `replicas` ready replicas of the model (it follows the lifecycle topic)."""
    parts = product.gateway.parts
    assert parts is not None
    deadline = time.monotonic() + timeout_s
    while len(parts.router.membership.ready(MODEL, time.time())) < replicas:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gateway did not see {replicas} ready replicas in {timeout_s:.0f} s")
        await asyncio.sleep(0.1)


async def _join_and_prove(run: _Run) -> None:
    """replica-1 asked for, planned, warmed and ready, beside a cold engine; the two compared."""
    fleet, product, out = run.fleet, run.product, run.out
    out.write(
        f"\nwarmplane scale --model {MODEL} --to 2: the API publishes fleet.scaled, the dev autoscaler "
        "starts replica-1,\nits warmer announces it, the planner plans it (a cold engine of the same model "
        "starts once it is ready, for comparison)\n"
    )
    out.flush()
    await _scale(product, to=2)
    driver = await run.autoscaler.next_scheduled()
    warm = await wait_ready(driver, out, check=fleet.check_starts)
    _report(warm, out)
    fleet.cold_reference()
    cold = await fleet.started(COLD_REFERENCE)
    await _routable(product, 2)
    compared = proof.routed_to(
        run.history.tail,
        run.words,
        replica=driver.replica,
        replicas=["replica-0", driver.replica],
        routing=run.routing,
        tenant=TENANT,
        model=MODEL,
    )
    engine = fleet.engines[driver.replica]
    warmed, baseline = await proof.compare(
        compared, engine.base_url, cold.base_url, model=MODEL, salt=fleet.salt()
    )
    proof.show(warmed, baseline, driver.replica, out)
    await fleet.stop_engine(COLD_REFERENCE)


async def _scale(product: Product, *, to: int) -> None:
    """Ask for `to` replicas as `warmplane scale` does: the API's admin action."""
    token = product.credentials.admin_token.get_secret_value()
    body = {"model": MODEL, "from_replicas": to - 1, "to_replicas": to}
    async with httpx.AsyncClient(base_url=product.api_url, timeout=30) as http:
        answer = await http.post("/v1/fleet/scale", json=body, headers={"Authorization": f"Bearer {token}"})
        answer.raise_for_status()


def _report(warm: WarmSummary, out: TextIO) -> None:
    partial = f" (partial: {warm.reason})" if warm.partial else ""
    out.write(
        f"replica-1 ready {warm.seconds_to_ready:.1f} s after it was scheduled "
        f"({warm.seconds_warming:.1f} s after its engine answered): "
        f"{warm.prefixes_warmed} prefixes planned, {warm.verified} verified held by a probe, "
        f"{warm.tokens_prefilled:,} tokens pre-filled, {warm.failures} failures{partial}\n\n"
    )


async def _until_stopped(
    planner: asyncio.Task[None], autoscaler: DevAutoscaler, fleet: Fleet, out: TextIO
) -> None:
    """Show each replica a scale-up starts until it is ready; until cancelled (a signal, see
    `stop_signals`). Raises if the planner stops first: it ended by itself after a failure (its log says
    why, with --verbose) and nothing would plan any more."""
    while True:
        scheduled = asyncio.ensure_future(autoscaler.scheduled.get())
        await asyncio.wait([planner, scheduled], return_when=asyncio.FIRST_COMPLETED)
        if planner.done():
            scheduled.cancel()
            planner.result()
            raise RuntimeError("the planner stopped by itself; run with --verbose to see why")
        driver = scheduled.result()
        out.write(f"{driver.replica} scheduled by a fleet.scaled\n")
        summary = await wait_ready(driver, out, check=fleet.check_starts)
        out.write(f"{driver.replica} is ready: {summary.verified} prefixes verified\n")
        out.flush()


async def _summarise(dsn: str, top: int, out: TextIO) -> None:
    db = await asyncpg.connect(dsn)
    try:
        leaves = await db.fetch("SELECT prefix_id, sum(requests) AS n FROM prefix_requests GROUP BY 1")
        nodes = await db.fetch("SELECT prefix_id, parent_id, depth, tokens FROM prefix_nodes")
        requests = sum(row["n"] for row in leaves)
    finally:
        await db.close()
    through = {row["prefix_id"]: 0 for row in nodes}
    for row in leaves:
        through[row["prefix_id"]] = row["n"]
    parent = {row["prefix_id"]: row["parent_id"] for row in nodes}
    for row in sorted(nodes, key=lambda r: -r["depth"]):  # children before parents
        if row["parent_id"] is not None:
            through[row["parent_id"]] += through[row["prefix_id"]]
    tokens = {row["prefix_id"]: row["tokens"] for row in nodes}
    # A prefix whose child carries all of its requests is that child's beginning: list only the child.
    covered = {up for p, up in parent.items() if up is not None and through[p] == through[up]}
    reused = [p for p in through if through[p] > 1]
    shared = sorted(
        (p for p in reused if p not in covered), key=lambda p: (through[p] - 1) * tokens[p], reverse=True
    )
    out.write(
        f"the planner counted {requests:,} requests durably in PostgreSQL, over {len(nodes):,} prefixes, "
        f"{len(reused):,} of them reused\n"
        f"top {top} prefixes by tokens a warm cache saves ((requests through it - 1) x tokens):\n"
        f"  {'prefix id':>21} {'depth':>5} {'tokens':>7} {'requests':>9} {'tokens saved':>13}\n"
    )
    for prefix in shared[:top]:
        out.write(
            f"  {prefix:>21} {len(_ancestors(prefix, parent)):>5} {tokens[prefix]:>7} "
            f"{through[prefix]:>9,} {(through[prefix] - 1) * tokens[prefix]:>13,}\n"
        )


def _ancestors(prefix: int, parent: dict[int, int | None]) -> list[int]:
    chain = [prefix]
    while (up := parent.get(chain[-1])) is not None:
        chain.append(up)
    return chain
