"""A replica's start to its plan at the warmer, idle and while ingestion runs at half its capacity, side by
side in one run, and a burst of starts at once (issue 19's targets: p99 <= 200 ms at half capacity; 1,000
replicas announced at once, every plan within 2 s p99). Run:

    python -m bench.plan_latency_bench [--starts 30] [--capacity-events 200000] [--load-seconds 30]
                                       [--burst 1000] [--load-rate EVENTS_PER_S]

On the embedded broker and Postgres, one planner process (`python -m warmplane.services.planner`, as
deployed). Its ingestion capacity is measured first: `--capacity-events` requests of the fleet shape
(`bench.ingest_bench`, without its replica starts) published at once, counted from the first committed batch
to the last (the group's stored offsets). Then, after one untimed start (its plan says both of the planner's
consumers have joined their groups), `--starts` replicas of the traffic's model are announced one after
another, each once the previous one's plan arrived (and then stopped, so the fleet stays one replica large),
idle, then while this process publishes requests of that shape, encoded and batched ahead and paced
(`paced_batches`), at half that capacity (or at `--load-rate`; the starts are then spread over
`--load-seconds`, so the load is steady however fast plans come; the capacity measured varies from run to run,
a fixed rate compares runs and versions); between the two, `--burst` replicas are announced at once (a fleet
scaling out by that many), each timed from the burst's sending, and then stopped. The loaded phase runs twice,
side by side: first with a planner whose ingestion never yields to planning
(`WARMPLANE_PLANS__INGEST_YIELD_S=0`), then, after a restart, with the planner's default (ingestion pauses
while a plan someone waits for is made), so the later phase, over the larger tables, is the default's. "At the
warmer" is a consumer of the plans topic, as a warmer's is (no engine: a plan's path ends where its warmer
receives it); a start's latency runs from sending its `replica.started` to its plan's arrival. Where each
phase's time went is read from the planner's own metrics (its endpoint, scraped around the phase): its batch
writes, its planning task by trigger type, the time its ingestion paused and the events it counted. Every
consumer fetches with a 20 ms wait: the embedded broker answers a fetch when its wait ends, where Kafka
answers when a record arrives. The bench shares the machine with the planner, the broker and Postgres: its
figures are of one run."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from bench.ingest_bench import MODELS, fleet_events, publish
from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from bench.warm_bench import percentile
from warmplane.services.planner.settings import IngestSettings, PlannerSettings, PlanSettings
from warmplane.shared import migrate
from warmplane.shared.codec import EventCodec
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres
from warmplane.shared.embedded.processes import free_port
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import Event, ReplicaStarted, ReplicaStopped, RequestObserved, WarmPlanIssued
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import KafkaSettings, PostgresSettings, settings_environment
from warmplane.shared.topics import Topics, partition_key

_TICK_S = 0.05
"""The paced load sends a tick's share of events at a time."""
_BATCH_BYTES = 256 * 1024
"""The bench's record batches: a tick's records of a partition fit in one. At aiokafka's default (16 KiB)
a tick took several batches a partition, and a partition's next batch waits until its last is sent: the
load fell short of its pace by round trips."""
_SENT = [0]
"""Events the paced load has sent."""


class Arrivals:
    """A consumer of `topic` from its end on, alone in no group: when each event's key (`key_of`, None for
    events not looked for) first arrived."""

    def __init__(self, kafka: KafkaSettings, topic: str, key_of: Callable[[Any], object | None]) -> None:
        self._kafka = kafka
        self._topic = topic
        self._key_of = key_of
        self._codec = EventCodec(kafka.max_event_bytes)
        self.arrived: dict[object, float] = {}

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[Arrivals]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._kafka.bootstrap_servers,
            enable_auto_commit=False,
            fetch_max_wait_ms=self._kafka.fetch_max_wait_ms,
        )
        await consumer.start()
        consumer.assign([TopicPartition(self._topic, p) for p in range(self._kafka.partitions)])
        await consumer.seek_to_end()
        task = asyncio.create_task(self._read(consumer))
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await consumer.stop()

    async def _read(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            for records in (await consumer.getmany(timeout_ms=100)).values():
                for record in records:
                    key = self._key_of(self._codec.decode(record.value))
                    if key is not None:
                        self.arrived.setdefault(key, time.perf_counter())


def plans_at_the_warmer(kafka: KafkaSettings) -> Arrivals:
    """When each plan answering a start arrived, as a warmer's consumer of the plans topic reads it."""
    return Arrivals(
        kafka,
        Topics(kafka.topic_prefix).plans,
        lambda e: e.trigger_event_id if isinstance(e, WarmPlanIssued) else None,
    )


def starts_heard(kafka: KafkaSettings) -> Arrivals:
    """When each start reached a plain consumer of the lifecycle topic: the broker's own hop, beside the
    planner's way to its handler."""
    return Arrivals(
        kafka,
        Topics(kafka.topic_prefix).lifecycle,
        lambda e: e.event_id if isinstance(e, ReplicaStarted) else None,
    )


_HOP = "a start, sent to a plain consumer (the broker's hop)"


async def start_latencies(
    kafka: KafkaSettings,
    warmer: Arrivals,
    producer: AIOKafkaProducer,
    starts: int,
    phase: str,
    *,
    going_on: Callable[[], bool] = lambda: True,
    heard: Arrivals | None = None,
    hops: list[float] | None = None,
    every_s: float = 0.0,
) -> list[float]:
    """Seconds from each of `starts` replicas' `replica.started` (sent, one after another, at most one
    every `every_s`) to its plan; no start is sent once `going_on()` is false. With `heard`
    (`starts_heard`), each start's seconds to it go to `hops`."""
    lifecycle, codec = Topics(kafka.topic_prefix).lifecycle, EventCodec(kafka.max_event_bytes)
    latencies = []
    for i in range(starts):
        if not going_on():
            break
        common = dict(producer="bench", model=MODELS[0], replica=f"{phase}-{i}", node=f"node-{i % 4}")
        start = ReplicaStarted(event_id=new_event_id(), occurred_at=datetime.now(UTC), **common)  # type: ignore[arg-type]
        sent = time.perf_counter()
        await producer.send_and_wait(lifecycle, codec.encode(start), key=partition_key(start))
        deadline = sent + 60
        while start.event_id not in warmer.arrived:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{phase}: no plan for start {i} in 60 s")
            await asyncio.sleep(0.001)
        latencies.append(warmer.arrived[start.event_id] - sent)
        if heard is not None and hops is not None and start.event_id in heard.arrived:
            hops.append(heard.arrived[start.event_id] - sent)
        stop = ReplicaStopped(event_id=new_event_id(), occurred_at=datetime.now(UTC), **common)  # type: ignore[arg-type]
        await producer.send_and_wait(lifecycle, codec.encode(stop), key=partition_key(stop))
        await asyncio.sleep(max(0.0, sent + every_s - time.perf_counter()))
    return latencies


async def burst_latencies(
    kafka: KafkaSettings,
    warmer: Arrivals,
    producer: AIOKafkaProducer,
    db: asyncpg.Connection,
    count: int,
) -> list[float]:
    """Seconds from sending `count` replicas' `replica.started` at once to each one's plan; then they are
    stopped, and this returns once the planner has them stopped."""
    lifecycle, codec = Topics(kafka.topic_prefix).lifecycle, EventCodec(kafka.max_event_bytes)
    replicas = [
        dict(producer="bench", model=MODELS[0], replica=f"burst-{i}", node=f"node-{i % 64}")
        for i in range(count)
    ]
    starts = [ReplicaStarted(event_id=new_event_id(), occurred_at=datetime.now(UTC), **r) for r in replicas]  # type: ignore[arg-type]
    sent = time.perf_counter()
    await asyncio.gather(
        *[await producer.send(lifecycle, codec.encode(s), key=partition_key(s)) for s in starts]
    )
    deadline = sent + 120
    while any(start.event_id not in warmer.arrived for start in starts):
        if time.perf_counter() > deadline:
            missing = sum(start.event_id not in warmer.arrived for start in starts)
            raise RuntimeError(f"burst: {missing} of {count} plans missing after 120 s")
        await asyncio.sleep(0.01)
    latencies = [warmer.arrived[start.event_id] - sent for start in starts]
    stops = [ReplicaStopped(event_id=new_event_id(), occurred_at=datetime.now(UTC), **r) for r in replicas]  # type: ignore[arg-type]
    await asyncio.gather(
        *[await producer.send(lifecycle, codec.encode(s), key=partition_key(s)) for s in stops]
    )
    live = "SELECT count(*) FROM replicas WHERE replica_id LIKE 'burst-%' AND state <> 'gone'"
    while await db.fetchval(live):
        if time.perf_counter() > deadline + 60:
            raise RuntimeError("burst: the planner did not record the stops in 60 s")
        await asyncio.sleep(0.05)
    return latencies


def encoded_load(kafka: KafkaSettings, count: int) -> list[tuple[int, bytes, bytes]]:
    """`count` fleet-shaped requests encoded ahead, as (partition, key, value): pacing them then costs what
    sending does."""
    codec, partitioner = EventCodec(kafka.max_event_bytes), DefaultPartitioner()
    partitions = list(range(kafka.partitions))
    load = []
    for event in fleet_events(count, seed=11):
        if isinstance(event, RequestObserved):
            key = partition_key(event)
            load.append((partitioner(key, partitions, partitions), key, codec.encode(event)))
    return load


Tick = tuple[int, list[tuple[int, Any]]]
"""A tick of the paced load: the events sent once it is out, and its record batches by partition."""


def paced_batches(
    producer: AIOKafkaProducer, load: list[tuple[int, bytes, bytes]], rate: float
) -> list[Tick]:
    """`load` cut into ticks of `rate` events a second, each tick's records appended ahead into a batch a
    partition (another where one fills). Appending a record costs the producer more than sending its batch
    does: done while the load ran, the bench's own sending could not keep up with half a planner's capacity
    on two cores. The records' timestamps are then when they were appended; nothing here reads them."""
    ticks: list[Tick] = []
    sent = 0
    while sent < len(load):
        due = min(len(load), int(rate * (len(ticks) + 1) * _TICK_S))
        full: list[tuple[int, Any]] = []
        open_batches: dict[int, Any] = {}
        for partition, key, value in load[sent:due]:
            batch = open_batches.get(partition)
            if batch is None:
                batch = open_batches[partition] = producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None) is None:
                full.append((partition, batch))
                batch = open_batches[partition] = producer.create_batch()
                batch.append(key=key, value=value, timestamp=None)
        ticks.append((due, full + list(open_batches.items())))
        sent = due
    return ticks


async def paced_load(kafka: KafkaSettings, producer: AIOKafkaProducer, ticks: list[Tick]) -> None:
    """Publish `ticks` (`paced_batches`) one every `_TICK_S`, until they are all sent or this is cancelled;
    `_SENT[0]` says how many events were sent."""
    topic = Topics(kafka.topic_prefix).requests
    began = time.perf_counter()
    _SENT[0] = 0
    for tick, (due, batches) in enumerate(ticks, 1):
        for partition, batch in batches:
            await producer.send_batch(batch, topic, partition=partition)
        _SENT[0] = due
        await asyncio.sleep(max(0.0, began + tick * _TICK_S - time.perf_counter()))


async def counted(db: asyncpg.Connection, group: str) -> int:
    """Events the group has counted (the topics are new: its stored next offsets, summed)."""
    query = "SELECT coalesce(sum(next_offset), 0) FROM ingest_offsets WHERE group_id = $1"
    return int(await db.fetchval(query, group))


async def capacity(kafka: KafkaSettings, db: asyncpg.Connection, group: str, events: int) -> float:
    """Events/s the planner counts, from the first committed batch of `events` sent at once to the last."""
    before = await counted(db, group)
    load: list[Event] = [e for e in fleet_events(events, seed=3) if isinstance(e, RequestObserved)]
    await publish(kafka, load)
    first: tuple[float, int] | None = None
    while (done := await counted(db, group) - before) < len(load):
        if first is None and done:
            first = (time.perf_counter(), done)
        await asyncio.sleep(0.02)
    if first is None:
        raise RuntimeError("the load was counted in one batch: publish more events")
    return (len(load) - first[1]) / (time.perf_counter() - first[0])


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples the planner's metrics endpoint serves, by (name, labels)."""
    async with httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(url)).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@dataclass(frozen=True, slots=True)
class Spent:
    """(count, seconds) of each kind of the planner's work between two scrapes."""

    work: dict[str, tuple[int, float]]
    events: int
    """Events the planner counted."""
    yielded_s: float
    """Seconds its ingestion paused for planning."""
    cpu_s: float = 0.0
    """Seconds of CPU the planner's process used."""

    @classmethod
    def between(cls, before: dict[Any, float], after: dict[Any, float]) -> Spent:
        work: dict[str, tuple[int, float]] = {}
        events, yielded, cpu = 0.0, 0.0, 0.0
        for (name, labels), value in after.items():
            gained = value - before.get((name, labels), 0.0)
            if name == "warmplane_planner_events_ingested_total":
                events += gained
            elif name == "warmplane_planner_ingest_yielded_seconds_total":
                yielded += gained
            elif name == "process_cpu_seconds_total":
                cpu += gained
            if name == "warmplane_planner_batch_write_seconds_count":
                what = "batch write"
            elif name == "warmplane_planner_planning_seconds_count":
                what = f"planning: {dict(labels)['trigger']}"
            elif name == "warmplane_planner_planning_queued_seconds_count":
                what = f"queued for planning: {dict(labels)['trigger']}"
            elif name == "warmplane_planner_start_ingested_seconds_count":
                what = "a start, sent to its batch committed"
            elif name == "warmplane_planner_start_delivered_seconds_count":
                what = "a start, sent to the consumer's handler"
            else:
                continue
            total = name.removesuffix("_count") + "_sum"
            count = int(value - before.get((name, labels), 0))
            work[what] = (count, after[(total, labels)] - before.get((total, labels), 0.0))
        return cls(work, round(events), yielded, cpu)


@contextlib.asynccontextmanager
async def planner_process(settings: PlannerSettings, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """A planner process (`python -m warmplane.services.planner`) on `settings`, its log to `log`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMPLANE_")}
    env.update(settings_environment(settings))
    with log.open("ab") as out:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "warmplane.services.planner", env=env, stdout=subprocess.DEVNULL, stderr=out
        )
    try:
        yield child
    finally:
        child.terminate()
        await asyncio.wait_for(child.wait(), 60)


_LOAD_LEAD_S = 2.0
"""Seconds the load runs before a loaded phase's first start."""


async def loaded_phase(
    kafka: KafkaSettings,
    warmer: Arrivals,
    producer: AIOKafkaProducer,
    metrics: str,
    *,
    rate: float,
    args: argparse.Namespace,
    phase: str,
    heard: Arrivals,
) -> Loaded:
    """Starts announced one after another while requests are paced at `rate` events/s, spread over the
    load's length: a plan that comes quickly does not end the phase before the load is steady."""
    ticks = paced_batches(producer, encoded_load(kafka, int(rate * args.load_seconds)), rate)
    load = asyncio.create_task(paced_load(kafka, producer, ticks))
    began = time.perf_counter()
    try:
        await asyncio.sleep(_LOAD_LEAD_S)  # the load under way
        before, scraped = await scrape(metrics), time.perf_counter()
        hops: list[float] = []
        latencies = await start_latencies(
            kafka,
            warmer,
            producer,
            args.starts,
            phase,
            going_on=lambda: not load.done(),
            heard=heard,
            hops=hops,
            every_s=max(0.0, args.load_seconds - _LOAD_LEAD_S - 2) / args.starts,
        )
        spent = Spent.between(before, await scrape(metrics))
        spent.work[_HOP] = (len(hops), sum(hops))
        seconds = time.perf_counter() - scraped
    finally:
        load.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await load
    achieved = _SENT[0] / (time.perf_counter() - began)
    if len(latencies) < max(5, args.starts // 3):
        raise RuntimeError(
            f"{phase}: only {len(latencies)} starts before the load ended: raise --load-seconds"
        )
    return Loaded(latencies, achieved, spent, seconds)


@dataclass(frozen=True, slots=True)
class Loaded:
    """A loaded phase: its starts' latencies, the load's achieved rate, the planner's work over the phase
    and the phase's seconds."""

    latencies: list[float]
    achieved: float
    spent: Spent
    seconds: float


async def bench(args: argparse.Namespace, workdir: Path, recorder: SummaryRecorder) -> None:
    with EmbeddedKafka(workdir / "kafka") as broker, EmbeddedPostgres(workdir / "postgres") as postgres:
        await asyncio.to_thread(migrate.upgrade, postgres.sqlalchemy_url)
        # A short fetch wait (module doc; `bench.broker_poll_bench` measures the broker's).
        kafka = KafkaSettings(
            bootstrap_servers=broker.bootstrap_servers, session_timeout_ms=6_000, fetch_max_wait_ms=20
        )
        group = "plan-latency-bench"
        settings = PlannerSettings(
            kafka=kafka,
            postgres=PostgresSettings(url=SecretStr(postgres.asyncpg_dsn)),
            ingest=IngestSettings(group_id=group),
            metrics_port=free_port(),
        )
        never = settings.model_copy(update={"plans": PlanSettings(ingest_yield_s=0)})
        metrics = f"http://127.0.0.1:{settings.metrics_port}/metrics"
        await ensure_topics(kafka, Topics(kafka.topic_prefix).all())
        db = await asyncpg.connect(postgres.asyncpg_dsn)
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka.bootstrap_servers, acks="all", linger_ms=2, max_batch_size=_BATCH_BYTES
        )
        await producer.start()
        warmer, heard = plans_at_the_warmer(kafka), starts_heard(kafka)
        loaded: dict[str, Loaded] = {}
        try:
            async with warmer.reading(), heard.reading():
                async with planner_process(never, workdir / "planner.log"):
                    rate = await capacity(kafka, db, group, args.capacity_events)
                    print(f"ingestion capacity: {rate:,.0f} events/s")
                    load = args.load_rate or rate / 2
                    # Not timed: the lifecycle consumer may join its group after the requests' one (faststream
                    # starts them one after the other, in no set order), and a start waits for it.
                    await start_latencies(kafka, warmer, producer, 1, "joined")
                    before = await scrape(metrics)
                    hops: list[float] = []
                    idle = await start_latencies(
                        kafka, warmer, producer, args.starts, "idle", heard=heard, hops=hops
                    )
                    spent = {"idle": Spent.between(before, await scrape(metrics))}
                    spent["idle"].work[_HOP] = (len(hops), sum(hops))
                    before = await scrape(metrics)
                    burst = await burst_latencies(kafka, warmer, producer, db, args.burst)
                    spent["burst"] = Spent.between(before, await scrape(metrics))
                    loaded[NEVER] = await loaded_phase(
                        kafka, warmer, producer, metrics, rate=load, args=args, phase="never", heard=heard
                    )
                async with planner_process(settings, workdir / "planner.log"):
                    await start_latencies(kafka, warmer, producer, 1, "restarted")  # the group has joined
                    loaded[YIELDS] = await loaded_phase(
                        kafka, warmer, producer, metrics, rate=load, args=args, phase="yields", heard=heard
                    )
        finally:
            await producer.stop()
            await db.close()
    spent.update({name: phase.spent for name, phase in loaded.items()})
    _report(recorder, args, rate=rate, idle=idle, loaded=loaded, burst=burst, spent=spent)


NEVER = "loaded, ingestion never yields"
YIELDS = "loaded, ingestion yields (default)"


def _report(
    recorder: SummaryRecorder,
    args: argparse.Namespace,
    *,
    rate: float,
    idle: Sequence[float],
    loaded: dict[str, Loaded],
    burst: Sequence[float],
    spent: dict[str, Spent],
) -> None:
    rows = []
    p99s: dict[str, float] = {}
    phases = [("idle", idle, None), *((name, phase.latencies, phase) for name, phase in loaded.items())]
    for name, seconds, phase in phases:
        ms = [1000 * s for s in seconds]
        p50, p99 = percentile(ms, 0.5), percentile(ms, 0.99)
        p99s[name] = p99
        said = name if phase is None else f"{name} ({phase.achieved:,.0f} events/s sent)"
        rows.append([said, len(ms), f"{p50:.0f}", f"{p99:.0f}", f"{max(ms):.0f}"])
        print(f"replica.started -> plan at the warmer, {said}: p50 {p50:.0f} ms, p99 {p99:.0f} ms")
        recorder.figure(f"replica.started -> plan at the warmer, {name}, p50", p50, "ms")
        figure = f"replica.started -> plan at the warmer, {name}, p99"
        if name == YIELDS:
            recorder.figure(figure, p99, "ms", baseline=(f"{NEVER}, p99", p99s[NEVER]))
        else:
            recorder.figure(figure, p99, "ms")
    ms = [1000 * s for s in burst]
    p50, p99 = percentile(ms, 0.5), percentile(ms, 0.99)
    rows.append(
        [f"{len(ms):,} announced at once (idle)", len(ms), f"{p50:.0f}", f"{p99:.0f}", f"{max(ms):.0f}"]
    )
    print(f"{len(ms):,} replicas announced at once -> plan at the warmer: p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    recorder.figure(f"{len(ms):,} replicas announced at once -> plan at the warmer, p50", p50, "ms")
    recorder.figure(f"{len(ms):,} replicas announced at once -> plan at the warmer, p99", p99, "ms")
    recorder.figure("planner ingestion capacity (fleet shape)", rate, "events/s")
    recorder.table(
        "Each phase: starts announced one after another; the burst's all at once, each timed from the"
        " burst's sending.",
        ["phase", "starts", "p50 ms", "p99 ms", "max ms"],
        rows,
    )
    recorder.table(
        "Where a phase's time went, from the planner's own histograms over the phase (count, mean and sum of"
        " seconds): its batch writes; a start's way from its sending to the consumer's handler (the fetch and"
        " the event loop's turn) and on to the commit of the batch that counted it; the planning task's queue"
        " and its work, by trigger type. Beside them, timed by this bench: a start's way to a plain consumer"
        " of the lifecycle topic (no group, same fetch wait), the broker's own hop and the floor of the"
        " planner's way to its handler. The rest of a start's latency is the plan's publication and the"
        " warmer's fetch.",
        ["phase", "work", "count", "mean ms", "total s"],
        [
            [phase, work, f"{count:,}", f"{1000 * total / count:.1f}", f"{total:.2f}"]
            for phase, by_work in spent.items()
            for work, (count, total) in by_work.work.items()
            if count
        ],
    )
    recorder.table(
        "Ingestion in each loaded phase: what the planner counted, against what was sent (this process sends"
        " it, on the same cores: it may fall short of the pace), how long it paused for planning, and the"
        " planner's CPU.",
        [
            "phase",
            "seconds",
            "events counted a second",
            "events sent a second",
            "ingestion paused s",
            "planner CPU s",
        ],
        [
            [
                name,
                f"{phase.seconds:.1f}",
                f"{phase.spent.events / phase.seconds:,.0f}",
                f"{phase.achieved:,.0f}",
                f"{phase.spent.yielded_s:.2f}",
                f"{phase.spent.cpu_s:.1f}",
            ]
            for name, phase in loaded.items()
        ],
    )
    for phase, by_work in spent.items():
        said = [f"{w} {n} x {1000 * t / n:.1f} ms" for w, (n, t) in by_work.work.items() if n]
        print(
            f"{phase}: {', '.join(said)}; ingestion paused {by_work.yielded_s:.2f} s;"
            f" planner CPU {by_work.cpu_s:.1f} s, {by_work.events:,} events counted"
        )
    counts = ", ".join(f"{name}: {len(phase.latencies)}" for name, phase in loaded.items())
    recorder.note(
        f"Target: p99 <= 200 ms at half capacity. One run, {args.starts} starts a phase (under load, those"
        f" sent before the load's {args.load_seconds:g} s ran out: {counts}); the load is paced at"
        + (
            f" {args.load_rate:,.0f} events/s (--load-rate), against a capacity measured at {rate:,.0f}"
            if args.load_rate
            else f" half the capacity measured first ({rate:,.0f} events/s)"
        )
        + f". Target for {len(burst):,} replicas announced at once: every plan within 2 s p99."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--starts", type=int, default=30, help="replicas announced one after another, a phase"
    )
    parser.add_argument("--load-seconds", type=float, default=30, help="the paced load's length at most")
    parser.add_argument("--burst", type=int, default=1_000, help="replicas announced at once, idle")
    parser.add_argument(
        "--load-rate",
        type=float,
        default=None,
        help="pace the load at this many events/s (default: half the capacity measured first); a fixed"
        " rate compares runs whose capacity measurements differ",
    )
    parser.add_argument(
        "--capacity-events", type=int, default=200_000, help="events published to measure capacity"
    )
    add_summary_option(parser)
    args = parser.parse_args()
    recorder = SummaryRecorder(
        bench="plan_latency",
        title="A replica's start to its plan at the warmer, idle and while ingestion runs at half capacity",
        module="bench.plan_latency_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=1,
    )
    with tempfile.TemporaryDirectory(prefix="warmplane-plan-latency-") as folder:
        asyncio.run(bench(args, Path(folder), recorder))
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
