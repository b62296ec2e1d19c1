"""What the control plane's consumers cost a quiet broker, and how late they see a record, by how long a
fetch may wait (`WARMPLANE_KAFKA__FETCH_MAX_WAIT_MS`). Run:

    python -m bench.broker_poll_bench [--runs 3] [--waits 100 250 500] [--warmers 2] [--idle-s 10] [--hops 12]

On the embedded broker, the consumers one small fleet runs at rest, each in its own group with the
production heartbeat (3 s): a planner's (the requests, misses, lifecycle and warm-results topics), a
warmer's per node (the plans topic) and a gateway's (the lifecycle topic). Nothing is published while the
broker's CPU time (and this process's, where the consumers run) is read over `--idle-s`; then `--hops`
times a record is published to the lifecycle topic and to the plans topic, each timed until the gateway's
consumer and every warmer's has it.

The baseline is the mix before the setting existed, in the same run: the planner waiting 50 ms, the warmers
20 ms, the gateway 50 ms. Each `--waits` value is that setting for every consumer. The configurations take
turns within each run; figures are medians over the runs (CPU) and over every hop of every run (latency).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bench.cpu_time import process_cpu_seconds, tree_cpu_seconds
from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics

BEFORE = "before: planner 50, warmers 20, gateway 50 ms"
_BEFORE_WAITS = {"planner": 50, "warmer": 20, "gateway": 50}
_ASSIGN_TIMEOUT_S = 60.0
_HOP_TIMEOUT_S = 10.0


@dataclass
class Mix:
    """One configuration's consumers, started, each reading in the background and noting when each record
    (by its value) reached it."""

    label: str
    consumers: dict[str, AIOKafkaConsumer]
    seen: dict[str, dict[bytes, float]] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def _read(self, name: str, consumer: AIOKafkaConsumer) -> None:
        book = self.seen.setdefault(name, {})
        while True:
            for records in (await consumer.getmany(timeout_ms=1_000)).values():
                now = time.monotonic()
                for record in records:
                    if record.value is not None:
                        book[record.value] = now

    def start_reading(self) -> None:
        self.tasks = [asyncio.create_task(self._read(name, c)) for name, c in self.consumers.items()]

    async def arrival(self, name: str, value: bytes) -> float:
        deadline = time.monotonic() + _HOP_TIMEOUT_S
        while (at := self.seen.get(name, {}).get(value)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.label}: {name} never saw a record within {_HOP_TIMEOUT_S} s")
            await asyncio.sleep(0.001)  # polls this process's own book; the clock is the arrival's
        return at


def _waits(wait_ms: int | None) -> dict[str, int]:
    if wait_ms is None:
        return dict(_BEFORE_WAITS)
    return {kind: wait_ms for kind in _BEFORE_WAITS}


@contextlib.asynccontextmanager
async def running_mix(
    kafka: KafkaSettings, label: str, wait_ms: int | None, warmers: int
) -> AsyncIterator[Mix]:
    topics = Topics(kafka.topic_prefix)
    waits = _waits(wait_ms)
    subscriptions = {
        "planner": (
            [topics.requests, topics.misses, topics.lifecycle, topics.warm_results],
            waits["planner"],
        ),
        "gateway": ([topics.lifecycle], waits["gateway"]),
        **{f"warmer-{n}": ([topics.plans], waits["warmer"]) for n in range(warmers)},
    }
    run = uuid.uuid4().hex[:8]
    consumers = {
        name: AIOKafkaConsumer(
            *subscribed,
            bootstrap_servers=kafka.bootstrap_servers,
            group_id=f"poll-bench-{run}-{name}",
            enable_auto_commit=False,
            auto_offset_reset="latest",
            session_timeout_ms=kafka.session_timeout_ms,
            heartbeat_interval_ms=kafka.heartbeat_interval_ms,
            fetch_max_wait_ms=wait,
        )
        for name, (subscribed, wait) in subscriptions.items()
    }
    mix = Mix(label, consumers)
    try:
        await asyncio.gather(*(c.start() for c in consumers.values()))
        deadline = time.monotonic() + _ASSIGN_TIMEOUT_S
        while not all(c.assignment() for c in consumers.values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{label}: the groups were not assigned within {_ASSIGN_TIMEOUT_S} s")
            await asyncio.gather(*(c.getmany(timeout_ms=100) for c in consumers.values()))
        for consumer in consumers.values():
            await consumer.seek_to_end()
            for partition in consumer.assignment():
                await consumer.position(partition)  # resolved now, not on the first hop
        mix.start_reading()
        yield mix
    finally:
        for task in mix.tasks:
            task.cancel()
        await asyncio.gather(*mix.tasks, return_exceptions=True)
        await asyncio.gather(*(c.stop() for c in consumers.values()), return_exceptions=True)


@dataclass
class Reading:
    broker_cpu: list[float] = field(default_factory=list)
    """Share of one core, per run."""
    client_cpu: list[float] = field(default_factory=list)
    lifecycle_ms: list[float] = field(default_factory=list)
    """Publish (acknowledged) until the gateway's consumer has it."""
    plans_ms: list[float] = field(default_factory=list)
    """Publish (acknowledged) until every warmer's consumer has it."""


async def measure_once(
    mix: Mix, broker_pid: int, producer: AIOKafkaProducer, topics: Topics, args: argparse.Namespace
) -> tuple[float, float, list[float], list[float]]:
    broker0, client0, start = (
        tree_cpu_seconds(broker_pid),
        sum(process_cpu_seconds(os.getpid())),
        time.monotonic(),
    )
    await asyncio.sleep(args.idle_s)  # the window CPU is read over, with nothing published
    elapsed = time.monotonic() - start
    broker = (tree_cpu_seconds(broker_pid) - broker0) / elapsed
    client = (sum(process_cpu_seconds(os.getpid())) - client0) / elapsed
    lifecycle, plans = [], []
    warmers = [name for name in mix.consumers if name.startswith("warmer-")]
    spacing = random.Random(args.runs)
    for hop in range(args.hops):
        # A random phase against the consumers' fetch cycles, so no hop is timed in step with one.
        await asyncio.sleep(spacing.uniform(0, 0.6))
        value = f"{mix.label}/{hop}/{uuid.uuid4().hex}".encode()
        sent = time.monotonic()
        await producer.send_and_wait(topics.lifecycle, value, key=value)
        lifecycle.append(1000 * (await mix.arrival("gateway", value) - sent))
        sent = time.monotonic()
        await producer.send_and_wait(topics.plans, value, key=value)
        arrivals = [await mix.arrival(name, value) for name in warmers]
        plans.append(1000 * (max(arrivals) - sent))
    return broker, client, lifecycle, plans


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Reading]:
    configurations: list[tuple[str, int | None]] = [(BEFORE, None)]
    configurations += [(f"every consumer {wait} ms", wait) for wait in args.waits]
    readings = {label: Reading() for label, _ in configurations}
    with EmbeddedKafka(workdir / "kafka") as broker:
        assert broker.pid is not None
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
        topics = Topics(kafka.topic_prefix)
        await ensure_topics(kafka, topics.all())
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
        await producer.start()
        try:
            for run in range(1, args.runs + 1):
                for label, wait in configurations:
                    async with running_mix(kafka, label, wait, args.warmers) as mix:
                        broker_cpu, client_cpu, lifecycle, plans = await measure_once(
                            mix, broker.pid, producer, topics, args
                        )
                    reading = readings[label]
                    reading.broker_cpu.append(broker_cpu)
                    reading.client_cpu.append(client_cpu)
                    reading.lifecycle_ms += lifecycle
                    reading.plans_ms += plans
                    print(
                        f"run {run}, {label}: broker {100 * broker_cpu:.1f}% of a core, consumers"
                        f" {100 * client_cpu:.1f}%, hop medians: lifecycle"
                        f" {statistics.median(lifecycle):.0f} ms, plans {statistics.median(plans):.0f} ms",
                        flush=True,
                    )
        finally:
            await producer.stop()
    return readings


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def summarise(recorder: SummaryRecorder, readings: dict[str, Reading]) -> None:
    before = readings[BEFORE]
    rows = []
    for label, reading in readings.items():
        rows.append(
            [
                label,
                f"{100 * statistics.median(reading.broker_cpu):.2f}",
                f"{100 * statistics.median(reading.client_cpu):.2f}",
                f"{statistics.median(reading.lifecycle_ms):.0f}",
                f"{_p99(reading.lifecycle_ms):.0f}",
                f"{statistics.median(reading.plans_ms):.0f}",
                f"{_p99(reading.plans_ms):.0f}",
            ]
        )
        if label == BEFORE:
            continue
        recorder.figure(
            f"broker CPU at rest, {label}",
            100 * statistics.median(reading.broker_cpu),
            "% of a core",
            (BEFORE, 100 * statistics.median(before.broker_cpu)),
        )
        recorder.figure(
            f"lifecycle record to the gateway, {label}, median",
            statistics.median(reading.lifecycle_ms),
            "ms",
            (BEFORE, statistics.median(before.lifecycle_ms)),
        )
    recorder.table(
        "At rest and per hop, by configuration (CPU: medians over runs; hops: median and p99 over all hops).",
        [
            "configuration",
            "broker, % of a core",
            "consumers, % of a core",
            "lifecycle hop, ms",
            "p99",
            "plans hop (every warmer), ms",
            "p99",
        ],
        rows,
    )
    recorder.note(
        "The embedded broker (Tansu) answers a waiting fetch late rather than when a record arrives, so on it"
        " a longer wait costs latency; Apache Kafka answers a fetch as soon as a record is there, so there"
        " the wait costs nothing but empty round trips. The consumers' CPU is this one process's."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--waits", type=int, nargs="+", default=[100, 250, 500])
    parser.add_argument("--warmers", type=int, default=2)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--hops", type=int, default=12)
    add_summary_option(parser)
    args = parser.parse_args()
    recorder = SummaryRecorder(
        bench="broker_poll",
        title="The control plane's consumers at rest: broker CPU and one hop's time, by fetch wait",
        module="bench.broker_poll_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=args.runs,
    )
    with tempfile.TemporaryDirectory(prefix="warmplane-poll-bench-") as folder:
        readings = asyncio.run(measure(args, Path(folder)))
    summarise(recorder, readings)
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
