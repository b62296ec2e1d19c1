"""Planner ingestion into durable Postgres aggregates, beside the raw aiokafka consume-and-decode loop.

Both read the same events from the same embedded broker and decode them with the same codec; the raw
loop stops there, the planner folds them and commits them to Postgres (fsync on) exactly once. Run:

    python -m bench.ingest_bench [--events 600000] [--runs 3] [--shape fleet|mooncake] [--planners 1,2]

Shapes: `fleet` is a multi-tenant fleet whose requests share system prompts, documents and templates
(chains of 3 to 4 segments, Zipf-distributed, so leaves repeat), one event in twenty a miss and one
in a thousand a replica starting, which the planner plans at once; `mooncake` replays the chains of
the real conversation trace the project ships (14 blocks a request, most of them unique), where
almost every request adds new chain nodes and a new leaf row.

Each run prints both rates and their ratio, and CPU time an event: the raw loop's, the in-process
planner's, and that of Postgres and the broker meanwhile (their whole process trees, from /proc). On
a machine shared with other work the rates swing with its load; the CPU times say what each part
costs, and the ratio is only meaningful within one run.

Each run measures the planner counts `--planners` names (default `1,2`): one planner in this process,
and N > 1 planner processes in one consumer group sharing the topics' partitions (the design's scaling
path), each on a fresh database; the raw loop is always one process, the bound of one consumer.
`--profile N` prints the in-process planner's top N functions. The planner processes' logs go to the
file named by BENCH_PLANNER_LOG, or to a temporary file kept only if the run fails: a planner that exits
by itself fails the run, which names its log. With BENCH_DUMP_STUCK=1 a planner process that does not
exit within 30 s of SIGTERM logs its asyncio tasks' stacks there before the bench fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import pstats
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from bench.cpu_time import tree_cpu_seconds
from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.services.planner.app import build_planner
from warmplane.services.planner.gc_tuning import tune_for_batches
from warmplane.services.planner.settings import IngestSettings, PlannerSettings
from warmplane.shared import migrate
from warmplane.shared.codec import DecodeFailure, EventCodec
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import Event, ModelRef, PrefixMissed, ReplicaStarted, RequestObserved
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import KafkaSettings, PostgresSettings, settings_environment
from warmplane.shared.topics import Topics, partition_key
from warmplane.shared.traces import CONVERSATION, trace_path

TRACE = trace_path(CONVERSATION)
MODELS = (ModelRef("llama-3-8b", "r1"), ModelRef("qwen-2-7b", "r4"))


def fleet_events(count: int, seed: int = 1) -> Iterator[Event]:
    """A multi-tenant fleet: system prompt -> document -> template [-> question], Zipf-popular."""
    rng = random.Random(seed)
    start = datetime.now(UTC) - timedelta(hours=1)
    weights = [1 / (rank + 1) ** 1.1 for rank in range(2_000)]
    leaves = rng.choices(range(2_000), weights, k=count)
    for i, leaf in enumerate(leaves):
        at = start + timedelta(milliseconds=i * 3_600_000 // count)
        tenant, model = f"tenant-{leaf % 16}", MODELS[leaf % 2]
        system, document, template = leaf % 40, leaf % 400, leaf
        chain = [system, 1_000 + document, 10_000 + template]
        if leaf % 3 == 0:
            chain.append(100_000 + rng.randrange(50))
        tokens = [800 * (depth + 1) for depth in range(len(chain))]
        common = dict(
            event_id=new_event_id(), occurred_at=at, producer="gateway-0", tenant=tenant, model=model
        )
        if i % 1_000 == 999:  # before the misses' test, which 999 passes too
            yield ReplicaStarted(**{**common, "tenant": ""}, replica=f"r{i % 8}", node=f"n{i % 4}")
        elif i % 20 == 19:
            yield PrefixMissed(
                **common, replica=f"r{leaf % 8}", chain=chain, chain_tokens=tokens, resident_depth=1
            )
        else:
            yield RequestObserved(
                **common,
                replica=f"r{leaf % 8}",
                chain=chain,
                chain_tokens=tokens,
                prompt_tokens=tokens[-1] + 40,
                cached_tokens=tokens[0] * (i % 2),
                ttft_ms=20.0 + i % 50,
            )


def mooncake_events(count: int) -> Iterator[Event]:
    """The conversation trace's real prefix chains (512-token blocks), repeated under new tenants."""
    rows = [msgspec.json.decode(line) for line in TRACE.read_bytes().splitlines()]
    start = datetime.now(UTC) - timedelta(hours=1)
    for i in range(count):
        row = rows[i % len(rows)]
        chain = row["hash_ids"]
        tokens = [min(512 * (d + 1), row["input_length"]) for d in range(len(chain))]
        yield RequestObserved(
            event_id=new_event_id(),
            occurred_at=start + timedelta(milliseconds=row["timestamp"]),
            producer="gateway-0",
            tenant=f"tenant-{i // len(rows)}",
            model=MODELS[0],
            replica="r0",
            chain=chain,
            chain_tokens=tokens,
            prompt_tokens=row["input_length"],
            cached_tokens=0,
        )


async def publish(kafka: KafkaSettings, events: list[Event]) -> None:
    """Publish pre-encoded events with per-partition batches, keyed as the emitter keys them."""
    topics = Topics(kafka.topic_prefix)
    await ensure_topics(kafka, topics.all())
    codec = EventCodec()
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", max_batch_size=1 << 20)
    await producer.start()
    try:
        partitioner = DefaultPartitioner()
        batches: dict[tuple[str, int], object] = {}
        pending = []
        for event in events:
            topic, key = topics.for_event(event), partition_key(event)
            partition = partitioner(key, list(range(kafka.partitions)), list(range(kafka.partitions)))
            batch = batches.get((topic, partition))
            if batch is None:
                batch = batches[(topic, partition)] = producer.create_batch()
            if batch.append(key=key, value=codec.encode(event), timestamp=None) is None:  # type: ignore[attr-defined]
                pending.append(await producer.send_batch(batch, topic, partition=partition))
                batch = batches[(topic, partition)] = producer.create_batch()
                batch.append(key=key, value=codec.encode(event), timestamp=None)  # type: ignore[attr-defined]
        for (topic, partition), batch in batches.items():
            pending.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def raw_loop(kafka: KafkaSettings, total: int) -> float:
    """Events/s of getmany + decode over every partition, from the first record to the last (prints the
    loop's CPU time too: the planner's own CPU time is the part of its cost it can change)."""
    topics = Topics(kafka.topic_prefix)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap_servers, max_partition_fetch_bytes=4 << 20, enable_auto_commit=False
    )
    await consumer.start()
    try:
        partitions = [
            TopicPartition(topic, p)
            for topic in (topics.requests, topics.misses, topics.lifecycle)
            for p in range(kafka.partitions)
        ]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        codec, seen, bad, started, cpu = EventCodec(), 0, 0, 0.0, 0.0
        while seen < total:
            fetched = await consumer.getmany(timeout_ms=500, max_records=5_000)
            if not started and fetched:
                started, cpu = time.perf_counter(), time.process_time()
            for records in fetched.values():
                for record in records:
                    bad += isinstance(codec.decode(record.value), DecodeFailure)
                seen += len(records)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        assert bad == 0, f"{bad} events failed to decode"
        print(f"  raw loop: {cpu:.2f} s of CPU in {elapsed:.2f} s, {cpu / total * 1e6:.1f} us an event")
        return total / elapsed
    finally:
        await consumer.stop()


@dataclass(frozen=True, slots=True)
class PlannerCost:
    """One in-process planner's run: its rate, CPU an event (its own, and Postgres's meanwhile), and the
    bytes its tables hold an event once every event is committed."""

    rate: float
    planner_us: float
    postgres_us: float
    stored_bytes: dict[str, float]
    """Bytes an event, by table (heap, indexes and TOAST, as written: no VACUUM FULL)."""
    wal_bytes: float
    """Write-ahead log an event: what a replica of the database, or its disk, takes per event."""
    rows_written: float
    """Rows inserted, updated or deleted an event, over the schema's tables (`pg_stat_user_tables`)."""


STORED_BYTES = """
SELECT c.relname, pg_total_relation_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND c.relname <> 'alembic_version'
"""
ROWS_WRITTEN = """
SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables
WHERE schemaname = current_schema()
"""


async def planner_run(
    settings: PlannerSettings, total: int, requests: int, parts: dict[str, int | None]
) -> PlannerCost:
    """The planner's events/s, from its first counted batch until all `total` are committed, with its
    costs an event."""
    db = await asyncpg.connect(settings.postgres.asyncpg_dsn())
    try:
        wal_before = await db.fetchval("SELECT pg_current_wal_lsn()::text")
        rows_before = await db.fetchval(ROWS_WRITTEN)
    finally:
        await db.close()
    planner = build_planner(settings)
    task = asyncio.create_task(planner.serve())
    try:
        done = 0
        first: tuple[float, int, float] | None = None
        while done < total:
            await asyncio.sleep(0.002)
            done = planner.metrics.events_ingested()
            if first is None and done:
                first = (time.perf_counter(), done, time.process_time())
                parts_cpu = {name: tree_cpu_seconds(pid) for name, pid in parts.items()}
        assert first is not None
        elapsed = time.perf_counter() - first[0]
        cpu = time.process_time() - first[2]
        counted = total - first[1]
        rate = counted / elapsed
        part_us = {
            name: (tree_cpu_seconds(pid) - parts_cpu[name]) / counted * 1e6 for name, pid in parts.items()
        }
        others = ", ".join(f"{name} {us:.1f}" for name, us in part_us.items())
        writes = {
            s.name.rsplit("_", 1)[-1]: s.value
            for m in planner.metrics.batch_seconds.collect()
            for s in m.samples
        }
        print(
            f"  planner: {writes['count']:.0f} batches,"
            f" {writes['sum']:.2f} s in Postgres writes, {cpu:.2f} s of planner CPU, in {elapsed:.2f} s,"
            f" {cpu / counted * 1e6:.1f} us an event"
        )
        print(f"  CPU us an event meanwhile: {others}")
    finally:
        planner.exit()
        await task
    db = await asyncpg.connect(settings.postgres.asyncpg_dsn())
    try:
        durable = await db.fetchval("SELECT sum(requests) FROM prefix_requests")
        assert durable == requests, f"Postgres holds {durable} requests, expected {requests}"
        sizes = {name: size / total for name, size in await db.fetch(STORED_BYTES) if size}
        wal = await db.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)", wal_before)
        rows = float(
            await db.fetchval(ROWS_WRITTEN) - rows_before
        )  # the planner's sessions flushed theirs on exit
    finally:
        await db.close()
    return PlannerCost(
        rate, cpu / counted * 1e6, part_us.get("postgres", 0.0), sizes, float(wal) / total, rows / total
    )


async def planner_processes_run(
    settings: PlannerSettings, processes: int, total: int, requests: int
) -> float:
    """Events/s of `processes` planner processes in one consumer group (the brief's scaling path),
    from the first batch committed in Postgres until all are: read every 20 ms from the group's stored
    offsets (a row a partition, committed with the counts; summing `prefix_stats` instead cost Postgres
    a scan of every row each time, CPU the planners need)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMPLANE_")}
    env.update(settings_environment(settings))
    command = [sys.executable, "-m", "warmplane.services.planner"]
    named = os.environ.get("BENCH_PLANNER_LOG")
    if named:
        log, log_path = os.open(named, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), named
    else:
        log, log_path = tempfile.mkstemp(prefix="ingest-bench-planners-", suffix=".log")
    children = [
        await asyncio.create_subprocess_exec(*command, env=env, stdout=subprocess.DEVNULL, stderr=log)
        for _ in range(processes)
    ]
    db = await asyncpg.connect(settings.postgres.asyncpg_dsn())
    try:
        first: tuple[float, int] | None = None
        while True:
            # The topics are new: the offsets consumed are the events counted.
            counted = int(
                await db.fetchval(
                    "SELECT coalesce(sum(next_offset), 0) FROM ingest_offsets WHERE group_id = $1",
                    settings.ingest.group_id,
                )
            )
            now = time.perf_counter()
            if first is None and counted:
                first = (now, counted)
            if counted >= total:
                break
            if exited := [child for child in children if child.returncode is not None]:
                raise RuntimeError(
                    f"planner process {exited[0].pid} exited by itself (code {exited[0].returncode})"
                    f" with {counted:,} of {total:,} events counted; its log: {log_path}"
                )
            await asyncio.sleep(0.02)
        durable = await db.fetchval("SELECT sum(requests) FROM prefix_requests")
        assert counted == total, f"the planners consumed {counted} events, expected {total}"
        assert durable == requests, f"Postgres holds {durable} requests, expected {requests}"
        assert first is not None
        rate = (total - first[1]) / (now - first[0])
    finally:
        await db.close()
        await _stop(children)
        os.close(log)
    if not named:
        os.unlink(log_path)  # kept only when the run failed (raised above)
    return rate


async def _stop(children: list[asyncio.subprocess.Process]) -> None:
    for child in children:
        if child.returncode is None:
            child.terminate()
    for child in children:
        try:
            await asyncio.wait_for(child.wait(), 30)
        except TimeoutError:
            if os.environ.get("BENCH_DUMP_STUCK"):
                child.send_signal(signal.SIGUSR1)  # the planner logs its tasks' stacks
                await asyncio.sleep(1)  # let it write them before the error ends the bench
            raise


async def fresh_database(postgres: EmbeddedPostgres) -> str:
    name = f"bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(postgres.asyncpg_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    dsn = postgres.asyncpg_dsn.rsplit("/", 1)[0] + f"/{name}"
    await asyncio.to_thread(migrate.upgrade, "postgresql+asyncpg://" + dsn.split("://", 1)[1])
    return dsn


async def main(args: argparse.Namespace, recorder: SummaryRecorder) -> None:
    with tempfile.TemporaryDirectory() as workdir, contextlib.ExitStack() as stack:
        kafka_part = stack.enter_context(EmbeddedKafka(Path(workdir) / "kafka"))
        postgres = stack.enter_context(EmbeddedPostgres(Path(workdir) / "pg"))
        kafka = KafkaSettings(
            bootstrap_servers=kafka_part.bootstrap_servers,
            topic_prefix="bench",
            session_timeout_ms=2_000,
            heartbeat_interval_ms=500,
        )
        make = fleet_events(args.events) if args.shape == "fleet" else mooncake_events(args.events)
        events = list(make)
        requests, total = sum(isinstance(e, RequestObserved) for e in events), len(events)
        began = time.perf_counter()
        await publish(kafka, events)
        print(f"published {total:,} {args.shape} events in {time.perf_counter() - began:.1f} s")
        # The published events must not stay in this process: the collector would walk them on every
        # full collection and bill both loops for a heap no planner or consumer holds.
        del events
        tune_for_batches()  # as the planner's main does; the raw loop gets the same settings
        raw: list[float] = []
        ingest: dict[int, list[float]] = {count: [] for count in args.planners}
        costs: list[PlannerCost] = []
        for run in range(args.runs):
            raw.append(await raw_loop(kafka, total))
            for count in args.planners:
                settings = PlannerSettings(
                    kafka=kafka,
                    postgres=PostgresSettings(url=await fresh_database(postgres)),
                    ingest=IngestSettings(group_id=f"bench-{run}-{uuid.uuid4().hex[:6]}"),
                    metrics_port=0,
                )
                profiler = cProfile.Profile() if args.profile and count == 1 else None
                if profiler:
                    profiler.enable()
                if count > 1:
                    rate = await planner_processes_run(settings, count, total, requests)
                else:
                    parts = {"postgres": postgres.pid, "broker": kafka_part.pid}
                    costs.append(await planner_run(settings, total, requests, parts))
                    rate = costs[-1].rate
                if profiler:
                    profiler.disable()
                    pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
                ingest[count].append(rate)
                print(
                    f"run {run + 1}: raw {raw[-1]:>9,.0f} ev/s   {_planners(count):<11} {rate:>9,.0f} ev/s"
                    f"   ratio {rate / raw[-1]:.2f}"
                )
        raw_median = statistics.median(raw)
        print(f"\nmedian of {args.runs} ({args.shape}, {total:,} events):")
        print(f"  raw aiokafka getmany + decode (1 process): {raw_median:>9,.0f} events/s")
        for count, rates in ingest.items():
            median = statistics.median(rates)
            ratios = sorted(rate / base for rate, base in zip(rates, raw, strict=True))
            print(
                f"  {_planners(count)} into Postgres:       {median:>9,.0f} events/s   ratio to raw:"
                f" {median / raw_median:.2f} (runs {ratios[0]:.2f} to {ratios[-1]:.2f})"
            )
            baseline = ("raw aiokafka getmany + decode, 1 process", raw_median)
            recorder.figure(f"{_planners(count)} into Postgres", median, "events/s", baseline)
            recorder.note(
                f"{_planners(count)}: the runs' own ratios went from {ratios[0]:.2f} to {ratios[-1]:.2f}."
            )
        recorder.table(
            f"Each run's rates ({args.shape}, {total:,} events), events/s.",
            ["run", "raw loop", *(_planners(count) for count in ingest)],
            [
                [run + 1, f"{raw[run]:,.0f}", *(f"{rates[run]:,.0f}" for rates in ingest.values())]
                for run in range(args.runs)
            ],
        )
        if costs:
            _record_costs(recorder, costs, args.shape)
        recorder.note(
            "Each run prints CPU time an event for the raw loop, the planner, Postgres and the broker (in the"
            " bench's own output): on a shared machine the rates swing with its load, the ratio less."
        )


def _record_costs(recorder: SummaryRecorder, costs: list[PlannerCost], shape: str) -> None:
    """One planner's costs an event, medians over runs: what `docs/scale-path.md` sizes a fleet with."""
    recorder.figure("1 planner: its CPU an event", statistics.median(c.planner_us for c in costs), "us")
    recorder.figure(
        "1 planner: Postgres CPU an event meanwhile", statistics.median(c.postgres_us for c in costs), "us"
    )
    recorder.figure("Postgres WAL an event", statistics.median(c.wal_bytes for c in costs), "bytes")
    rows = statistics.median(c.rows_written for c in costs)
    recorder.figure("Postgres rows written an event", rows, "rows")
    recorder.figure(
        "Postgres bytes stored an event",
        statistics.median(sum(c.stored_bytes.values()) for c in costs),
        "bytes",
    )
    tables = sorted({name for c in costs for name in c.stored_bytes})
    by_table = [(name, statistics.median(c.stored_bytes.get(name, 0.0) for c in costs)) for name in tables]
    recorder.table(
        f"Bytes an event each table holds after one planner's run ({shape}; heap, indexes and TOAST as"
        " written, no VACUUM FULL), medians over runs; tables under 1 byte an event left out.",
        ["table", "bytes an event"],
        [[name, f"{size:,.1f}"] for name, size in sorted(by_table, key=lambda row: -row[1]) if size >= 1],
    )


def _planners(count: int) -> str:
    return "1 planner" if count == 1 else f"{count} planners"


def _counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",")]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("planner counts are positive integers, such as 1,2")
    return counts


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=600_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--shape", choices=("fleet", "mooncake"), default="fleet")
    parser.add_argument(
        "--planners",
        type=_counts,
        default=[1, 2],
        help="planner counts to measure in each run, comma-separated: 1 runs in process, N > 1 runs N"
        " processes in one consumer group (default 1,2)",
    )
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="print the planner's top N functions"
    )
    add_summary_option(parser)
    args = parser.parse_args()
    recorder = SummaryRecorder(
        # The report keeps a section per shape (bench.report's `ingest` and `ingest_chat`).
        bench="ingest" if args.shape == "fleet" else "ingest_chat",
        title="Planner ingestion into durable Postgres aggregates, against the raw consume-and-decode loop"
        + ("" if args.shape == "fleet" else ", on chat-shaped traffic"),
        module="bench.ingest_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=args.runs,
    )
    asyncio.run(main(args, recorder))
    recorder.write(args.summary_json)
