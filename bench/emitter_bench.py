"""The event emitter on a real broker: what `emit()` costs its caller, and how many events a second it
delivers, beside raw aiokafka `send_batch` of the same pre-encoded bytes (the ceiling). Run:

    python -m bench.emitter_bench [--runs 5] [--events 1000000] [--calls 200000]

Each run starts its own in-memory Tansu broker (it never evicts: a fresh one keeps memory flat). Events
are `RequestObserved` with chains of 8 ids from a multi-tenant fleet (16 tenants x 2 models x 64
system prompts, about 630 bytes encoded); a pool of `--pool` distinct events is cycled, so an event
object is cold in the CPU caches when emitted, as in a serving process.

Phases of a run: (a) caller cost: `perf_counter_ns` around each of `--calls` emits into a running,
connected emitter; (b) throughput: `--events` emits, from the first one until `close()` returned, which
is when the broker acknowledged the last batch (Tansu's ListOffsets under-reports the end offset by
the size of the last batch less one, so acknowledgements are the count used); (c) raw: the same
keys and values, pre-encoded and pre-partitioned, through `create_batch`/`send_batch` with one and
with two producer connections. Medians over runs are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from aiokafka import AIOKafkaProducer

from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.shared.codec import EventCodec
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.emitter import Emitter
from warmplane.shared.emitter_kafka import java_partition
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, RequestObserved
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import EmitterSettings, KafkaSettings
from warmplane.shared.topics import Topics, partition_key

MODELS = (ModelRef("meta-llama/Llama-3.1-8B-Instruct", "main"), ModelRef("Qwen/Qwen2.5-7B-Instruct", "r4"))
PARTITIONS = 4
RAW_BATCH_EVENTS = 1_000
YIELD_EVERY = 64  # emits between two yields to the loop, as request handlers would interleave


def fleet_requests(count: int, seed: int = 7) -> list[RequestObserved]:
    """Distinct request events: chains of 8 ids whose root (the system prompt) repeats, the rest varies."""
    rng = random.Random(seed)
    roots = [[rng.getrandbits(64) - 2**63 for _ in range(64)] for _ in range(16)]
    now = datetime.now(UTC)
    events = []
    for i in range(count):
        tenant = i % 16
        chain = [rng.choice(roots[tenant])] + [rng.getrandbits(64) - 2**63 for _ in range(7)]
        tokens = [512 * (depth + 1) for depth in range(8)]
        events.append(
            RequestObserved(
                event_id=new_event_id(),
                occurred_at=now,
                producer="vllm-router-0",
                tenant=f"tenant-{tenant}",
                model=MODELS[i % 2],
                replica=f"replica-{i % 8}",
                chain=chain,
                chain_tokens=tokens,
                prompt_tokens=tokens[-1] + 37,
                cached_tokens=tokens[2],
                ttft_ms=18.5 + i % 40,
                route="/v1/chat/completions",
            )
        )
    return events


@dataclass
class Run:
    p50_us: float
    p99_us: float
    p999_us: float
    max_us: float
    emitter_per_s: float
    emitter_cpu_us: float
    raw1_per_s: float
    raw2_per_s: float


async def call_cost(
    kafka: KafkaSettings, topics: Topics, pool: list[RequestObserved], calls: int
) -> list[int]:
    """Nanoseconds of each of `calls` emits into a connected emitter that sends as it goes."""
    samples = [0] * calls
    async with Emitter(kafka, EmitterSettings(), topics) as emitter:
        await _connected(emitter)
        clock, emit = time.perf_counter_ns, emitter.emit
        for i in range(calls):
            event = pool[i % len(pool)]
            began = clock()
            emit(event)
            samples[i] = clock() - began
            if i % YIELD_EVERY == 0:
                await _make_room(emitter)
        dropped = emitter.stats.dropped_total
    if dropped:
        raise RuntimeError(f"{dropped} events dropped while measuring the call cost")
    return samples


async def emitter_throughput(
    kafka: KafkaSettings, settings: EmitterSettings, topics: Topics, pool: list[RequestObserved], total: int
) -> tuple[float, float]:
    """(events/s, process CPU µs per event) from the first emit until close() returned."""
    emitter = Emitter(kafka, settings, topics)
    await emitter.start()
    await _connected(emitter)
    began, cpu_began = time.perf_counter(), time.process_time()
    emit = emitter.emit
    for i in range(total):
        emit(pool[i % len(pool)])
        if i % YIELD_EVERY == 0:
            await _make_room(emitter)
    await emitter.close(timeout_s=120)
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    stats = emitter.stats
    if stats.sent != total or stats.dropped_total:
        raise RuntimeError(f"emitter delivered {stats.sent} of {total}: {stats}")
    return total / elapsed, cpu / total * 1e6


async def raw_throughput(
    bootstrap: str, topic: str, by_partition: dict[int, list[tuple[bytes, bytes]]], connections: int
) -> float:
    """Events/s of aiokafka send_batch alone, pre-encoded records; partition p on connection p % n."""
    producers = [
        AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_batch_size=1_000_000, linger_ms=0)
        for _ in range(connections)
    ]
    await asyncio.gather(*(producer.start() for producer in producers))
    try:
        total = sum(len(records) for records in by_partition.values())
        next_index = dict.fromkeys(by_partition, 0)
        deliveries = []
        began = time.perf_counter()
        timestamp = time.time_ns() // 1_000_000
        while any(next_index[p] < len(records) for p, records in by_partition.items()):
            for partition, records in by_partition.items():
                start = index = next_index[partition]
                if index >= len(records):
                    continue
                producer = producers[partition % connections]
                batch = producer.create_batch()
                while index < len(records) and index - start < RAW_BATCH_EVENTS:
                    key, value = records[index]
                    if batch.append(timestamp=timestamp, key=key, value=value) is None:
                        break
                    index += 1
                next_index[partition] = index
                deliveries.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*deliveries)
        return total / (time.perf_counter() - began)
    finally:
        await asyncio.gather(*(producer.stop() for producer in producers))


async def one_run(workdir: Path, args: argparse.Namespace, pool: list[RequestObserved]) -> Run:
    with EmbeddedKafka(workdir) as broker:
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers, partitions=PARTITIONS)
        prefixes = ("calls", "emitter", "raw1", "raw2")
        await ensure_topics(kafka, [Topics(prefix).requests for prefix in prefixes])
        samples = sorted(await call_cost(kafka, Topics("calls"), pool, args.calls))
        settings = EmitterSettings(batch_max_events=args.batch_events)
        per_s, cpu_us = await emitter_throughput(kafka, settings, Topics("emitter"), pool, args.events)
        by_partition = _pre_partitioned(pool, args.events)
        raw1 = await raw_throughput(broker.bootstrap_servers, Topics("raw1").requests, by_partition, 1)
        raw2 = await raw_throughput(broker.bootstrap_servers, Topics("raw2").requests, by_partition, 2)

    def quantile_us(q: float) -> float:
        return samples[min(len(samples) - 1, int(q * len(samples)))] / 1000

    return Run(
        quantile_us(0.5), quantile_us(0.99), quantile_us(0.999), samples[-1] / 1000, per_s, cpu_us, raw1, raw2
    )


def _pre_partitioned(pool: list[RequestObserved], total: int) -> dict[int, list[tuple[bytes, bytes]]]:
    codec = EventCodec()
    encoded = [(partition_key(event), codec.encode(event)) for event in pool]
    by_partition: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in range(PARTITIONS)}
    for i in range(total):
        key, value = encoded[i % len(encoded)]
        by_partition[java_partition(key, PARTITIONS)].append((key, value))
    return by_partition


async def _connected(emitter: Emitter, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not emitter.stats.connected:
        if time.monotonic() > deadline:
            raise TimeoutError("the emitter did not connect")
        await asyncio.sleep(0.01)


async def _make_room(emitter: Emitter) -> None:
    """Yield to the loop; if the buffer is nearly full, wait for the sender (a benchmark must not drop)."""
    await asyncio.sleep(0)
    while emitter.stats.buffered > 90_000:  # noqa: ASYNC110 - the emitter offers no "room" event to wait on
        await asyncio.sleep(0.001)


def _print_table(runs: list[Run], args: argparse.Namespace, recorder: SummaryRecorder) -> None:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    emitter = med([r.emitter_per_s for r in runs])
    raw1, raw2 = med([r.raw1_per_s for r in runs]), med([r.raw2_per_s for r in runs])
    print(
        f"\nemitter bench: {len(runs)} runs, {args.events:,} events each, {PARTITIONS} partitions, "
        f"{os.cpu_count()} CPUs, batch_max_events={args.batch_events}"
    )
    print(f"{'metric':<44}{'median':>12}{'min':>12}{'max':>12}")
    rows = [
        ("emit() p50 [µs]", [r.p50_us for r in runs]),
        ("emit() p99 [µs]", [r.p99_us for r in runs]),
        ("emit() p99.9 [µs]", [r.p999_us for r in runs]),
        ("emit() max [µs]", [r.max_us for r in runs]),
        ("emitter, first emit to all acked [events/s]", [r.emitter_per_s for r in runs]),
        ("emitter process CPU [µs/event]", [r.emitter_cpu_us for r in runs]),
        ("raw send_batch, 1 connection [events/s]", [r.raw1_per_s for r in runs]),
        ("raw send_batch, 2 connections [events/s]", [r.raw2_per_s for r in runs]),
    ]
    for name, values in rows:
        print(f"{name:<44}{med(values):>12,.1f}{min(values):>12,.1f}{max(values):>12,.1f}")
    print(f"ratio emitter / raw (1 connection):  {emitter / raw1:.2f}")
    print(f"ratio emitter / raw (2 connections): {emitter / raw2:.2f}   (the emitter uses 2 connections)")
    name = "emitter, first emit to all acked"
    recorder.figure(name, emitter, "events/s", ("raw send_batch, 2 connections", raw2))
    recorder.figure(name, emitter, "events/s", ("raw send_batch, 1 connection", raw1))
    recorder.figure("emit() call, p50", med([r.p50_us for r in runs]), "us")
    recorder.figure("emit() call, p99", med([r.p99_us for r in runs]), "us")
    recorder.table(
        f"Over {len(runs)} runs of {args.events:,} events each, {PARTITIONS} partitions,"
        f" batch_max_events={args.batch_events}.",
        ["metric", "median", "min", "max"],
        [[name, f"{med(v):,.1f}", f"{min(v):,.1f}", f"{max(v):,.1f}"] for name, v in rows],
    )
    recorder.note(
        "The emitter uses 2 producer connections: raw send_batch over 2 is the like-for-like ceiling."
    )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--pool", type=int, default=100_000)
    parser.add_argument("--batch-events", type=int, default=EmitterSettings().batch_max_events)
    add_summary_option(parser)
    args = parser.parse_args()
    recorder = SummaryRecorder(
        bench="emitter",
        title="The event emitter on a real broker: cost to its caller, throughput against raw send_batch",
        module="bench.emitter_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=args.runs,
    )
    pool = fleet_requests(args.pool)
    runs = []
    with tempfile.TemporaryDirectory(prefix="emitter-bench-") as tmp:
        for index in range(args.runs):
            run = await one_run(Path(tmp) / f"run-{index}", args, pool)
            print(
                f"run {index + 1}: emit p50 {run.p50_us:.2f} µs p99 {run.p99_us:.2f} µs "
                f"p99.9 {run.p999_us:.2f} µs; "
                f"emitter {run.emitter_per_s:,.0f}/s ({run.emitter_cpu_us:.2f} µs CPU/event), "
                f"raw {run.raw1_per_s:,.0f}/s (1 conn) {run.raw2_per_s:,.0f}/s (2 conns)",
                flush=True,
            )
            runs.append(run)
    _print_table(runs, args, recorder)
    recorder.write(args.summary_json)


if __name__ == "__main__":
    asyncio.run(main())
