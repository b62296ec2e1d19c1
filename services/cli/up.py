"""`warmplane up`: the main job on its embedded defaults, from nothing to a warm replica and a summary.

It starts the broker, Postgres and Redis from their wheels, migrates, runs the planner and a node's warmer
with a first vLLM replica (which serves cold), replays a recorded trace as request events through the
emitter SDK (as serving nodes would publish them, with stand-in token payloads for the catalog), waits
until the planner has counted every one durably and prints what it learned. Then it schedules a second
replica and shows it being planned, warmed, verified and turning ready, and compares the cached share of
the trace's latest requests on the warmed replica and on the cold one (`up_fleet`). Everything it started
is stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TextIO

import asyncpg
from pydantic import SecretStr

from warmplane.services.cli.progress import Progress
from warmplane.services.cli.replay import emit_paced
from warmplane.services.cli.up_fleet import (
    PROBE_DEPTH,
    VOCAB,
    Fleet,
    WarmSummary,
    cached_shares,
    payload_depth,
    wait_ready,
)
from warmplane.services.planner.app import Planner, build_planner
from warmplane.services.planner.gc_tuning import tune_for_batches
from warmplane.services.planner.settings import (
    ColdStartSettings,
    IngestSettings,
    PlannerSettings,
    PlanSettings,
    RingSettings,
)
from warmplane.shared import migrate
from warmplane.shared.embedded import EmbeddedStack
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE
from warmplane.shared.emitter import Emitter
from warmplane.shared.events import ModelRef, PrefixPayload
from warmplane.shared.mooncake_trace import TraceRequest, chain_prompt, read_trace, request_event
from warmplane.shared.settings import EmitterSettings, KafkaSettings, PostgresSettings
from warmplane.shared.topics import Topics
from warmplane.shared.traces import CONVERSATION, trace_path

DEFAULT_TRACE = trace_path(CONVERSATION)
MODEL = ModelRef("trace-model", "rev-1")
TENANT = "demo"
REPLICAS = 4
"""Replicas the recorded traffic is spread over in its events (by the chain's second block)."""
COMPARED_REQUESTS = 200
PLAN_WINDOW_MINUTES = 10
# A plan's deadline runs from its issue, when the warmer announces the replica, so it includes the
# engine's start-up: about 60 s for the CPU build on a quiet 2-core machine, twice that when it is busy.
# The planner's default (120 s) then cut warming short and the replica turned ready partly warm.
PLAN_DEADLINE_S = 600.0
"""Conversations are recency-driven: the policy reads the trace's last minutes only."""
ROUTING_DEPTH = 1
"""The conversation trace's requests share their first block, so they are routed by their second (the
trace evaluator's automatic depth); the planner plans each replica for that share of the ring."""
PLAN_EVENT_BYTES = 1_000_000
"""Room for a plan of long stand-in prompts in one event (Kafka's default message limit is about 1 MB)."""


@dataclass(frozen=True, slots=True)
class UpOptions:
    trace: Path
    limit: int | None
    workdir: Path | None
    keep_running: bool
    top: int = 10


async def run_up(options: UpOptions, out: TextIO) -> None:
    """Run the main job; raise `FileNotFoundError` if the trace is missing."""
    trace = options.trace.resolve()
    if not trace.is_file():
        raise FileNotFoundError(f"no trace at {trace}: pass one with --trace")
    with contextlib.ExitStack() as exits:
        workdir = options.workdir or Path(
            exits.enter_context(tempfile.TemporaryDirectory(prefix="warmplane-"))
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
        settings = PlannerSettings(
            kafka=kafka,
            postgres=PostgresSettings(url=SecretStr(stack.postgres.asyncpg_dsn)),
            ingest=IngestSettings(),
            plans=PlanSettings(window_hours=PLAN_WINDOW_MINUTES / 60, deadline_s=PLAN_DEADLINE_S),
            routing=RingSettings(depth=ROUTING_DEPTH),
            # The replayed trace has no cache figures (every request looks cold), and replica-0 is the
            # job's cold reference: an alarm would warm it.
            cold_start=ColdStartSettings(enabled=False),
            metrics_port=0,
        )
        tune_for_batches()
        planner = build_planner(settings)
        task = asyncio.create_task(planner.serve(), name="planner")
        secret = SecretStr(secrets.token_urlsafe(32))
        try:
            async with Fleet(workdir, MODEL.name, kafka, TENANT, secret) as fleet:
                out.write("scheduling replica-0 (vLLM on the CPU, a tiny local model) before any traffic\n")
                driver = await fleet.schedule(0)
                cold = await wait_ready(driver, out, check=fleet.check_starts)
                out.write(f"replica-0 is ready: {cold.reason}\n\n")
                requests, seconds = await _replay(trace, options.limit, kafka, planner, out)
                await _summarise(stack.postgres.asyncpg_dsn, len(requests), seconds, options.top, out)
                out.write("\nscheduling replica-1: its warmer announces it, the planner plans it\n")
                driver = await fleet.schedule(1)
                warm = await wait_ready(driver, out, check=fleet.check_starts)
                recent = requests[-COMPARED_REQUESTS:]
                shares = await cached_shares(fleet.engines[::-1], MODEL.name, recent, fleet.salt())
                _report(warm, shares, len(recent), out)
                if options.keep_running:
                    out.write(f"running; warmer status at http://127.0.0.1:{fleet.warmer.http_port}/status\n")
                    out.write("Ctrl-C stops everything\n")
                    out.flush()
                    await _until_stopped(task)
        finally:
            planner.exit()
            async with asyncio.timeout(30):
                await task


async def _until_stopped(planner: asyncio.Task[None]) -> None:
    """Wait until cancelled (a signal, see `stop_signals`); raise if the planner stops first: it ended
    by itself after a failure (its log says why, with --verbose) and nothing would plan any more."""
    await asyncio.wait([planner])
    planner.result()
    raise RuntimeError("the planner stopped by itself; run with --verbose to see why")


def _report(warm: WarmSummary, shares: list[float], compared: int, out: TextIO) -> None:
    partial = f" (partial: {warm.reason})" if warm.partial else ""
    out.write(
        f"\nreplica-1 ready {warm.seconds_to_ready:.1f} s after it was scheduled "
        f"({warm.seconds_warming:.1f} s after its engine answered): "
        f"{warm.prefixes_warmed} prefixes planned, {warm.verified} verified held by a probe, "
        f"{warm.tokens_prefilled:,} tokens pre-filled, {warm.failures} failures{partial}\n"
        f"the trace's last {compared} requests ({PROBE_DEPTH * BLOCK_SIZE:,}-token prompts), "
        "sent to each replica:\n"
        f"  replica-1 (warmed): {shares[0]:.1%} of prompt tokens served from the prefix cache\n"
        f"  replica-0 (cold):   {shares[1]:.1%}\n"
    )


async def _replay(
    trace: Path, limit: int | None, kafka: KafkaSettings, planner: Planner, out: TextIO
) -> tuple[list[TraceRequest], float]:
    """Emit the trace's requests, then wait for the planner to count them; (requests, seconds).

    Blocks shrink to the engine's (32 tokens) so chains fit the tiny model, and a request carries the
    stand-in payload of one chain element the first time that element is seen (`payload_depth`)."""
    requests = list(read_trace(trace, limit))
    span_ms = requests[-1].timestamp if requests else 0
    start = datetime.now(UTC) - timedelta(milliseconds=span_ms)
    progress = Progress(out, total=len(requests), label="replayed / counted")
    began = time.perf_counter()
    catalogued: set[int] = set()
    async with Emitter(kafka, EmitterSettings(), Topics(kafka.topic_prefix)) as emitter:
        for index, request in enumerate(requests):
            replica = f"vllm-{request.hash_ids[min(1, len(request.hash_ids) - 1)] % REPLICAS}"
            depth = payload_depth(request, catalogued)
            payload = None
            if depth is not None:
                prompt = chain_prompt(request.hash_ids[:depth], BLOCK_SIZE, VOCAB)
                payload = PrefixPayload(prefix_id=request.hash_ids[depth - 1], prompt=prompt)
            event = request_event(
                request,
                start=start,
                tenant=TENANT,
                model=MODEL,
                replica=replica,
                block_tokens=BLOCK_SIZE,
                payload=payload,
            )
            await emit_paced(emitter, event)
            if index % 2_000 == 0:
                progress.show(index, _counted(planner))
                await asyncio.sleep(0)
    emitted = len(requests)
    deadline = time.monotonic() + 120
    while (counted := _counted(planner)) < emitted:
        progress.show(emitted, counted)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the planner counted {counted} of {emitted} events within 120 s")
        await asyncio.sleep(0.1)
    progress.show(emitted, counted, final=True)
    return requests, time.perf_counter() - began


async def _summarise(dsn: str, emitted: int, seconds: float, top: int, out: TextIO) -> None:
    db = await asyncpg.connect(dsn)
    try:
        leaves = await db.fetch("SELECT prefix_id, sum(requests) AS n FROM prefix_stats GROUP BY 1")
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
        f"\n{emitted:,} request events replayed and counted durably in {seconds:.1f} s "
        f"({emitted / seconds:,.0f} events/s); Postgres holds {requests:,} requests over "
        f"{len(nodes):,} prefixes, {len(reused):,} of them reused\n"
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


def _counted(planner: Planner) -> int:
    return planner.metrics.events_ingested("request.observed")
