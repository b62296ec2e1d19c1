"""The emitter's batching: one topic's events into record batches, each on its key's Java partition.

Pure CPU work on the sender's hot path (about 0.2 µs an event beside aiokafka's own batch building),
kept free of I/O so its invariants are easy to test: order within a key is kept, no batch exceeds the
events it was given, and every event ends in exactly one `Flight`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from warmplane.shared.emitter_kafka import BatchProducer, KeyHashCache, RecordBatch


@dataclass(eq=False, slots=True)
class Flight:
    """Events that travel together: one partition's batch, or one topic's events awaiting routing."""

    topic: str
    attempt: int
    partition: int = -1
    batch: RecordBatch | None = None
    keys: list[bytes] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)
    delivery: asyncio.Future[Any] | None = None
    timer: asyncio.TimerHandle | None = None
    settled: bool = False


def split_into_batches(
    producer: BatchProducer, group: Flight, partitions: list[int], hashes: KeyHashCache, timestamp_ms: int
) -> list[Flight]:
    """The batches of `group` (one topic), each key on the partition Java's default partitioner picks.

    `partitions` are the topic's partition ids, sorted. A batch full in bytes is closed and another one
    started (aiokafka always takes a fresh batch's first record). The flights inherit `group.attempt`.
    """
    count, keys, values = len(partitions), group.keys, group.values
    keys_of: list[list[bytes]] = [[] for _ in partitions]
    values_of: list[list[bytes]] = [[] for _ in partitions]
    for key, value, positive in zip(keys, values, hashes.positive_hashes(keys), strict=False):
        slot = positive % count
        keys_of[slot].append(key)
        values_of[slot].append(value)
    flights: list[Flight] = []
    for slot, partition in enumerate(partitions):
        if keys_of[slot]:
            flights += _batches(producer, group, partition, (keys_of[slot], values_of[slot]), timestamp_ms)
    return flights


def _batches(
    producer: BatchProducer,
    group: Flight,
    partition: int,
    records: tuple[list[bytes], list[bytes]],
    timestamp_ms: int,
) -> list[Flight]:
    """One partition's events in as many batches as their bytes need (usually one)."""
    keys, values = records
    flights: list[Flight] = []
    batch = producer.create_batch()
    append, start = batch.append, 0
    for key, value in zip(keys, values, strict=False):
        if append(timestamp=timestamp_ms, key=key, value=value) is None:
            end = start + batch.record_count()
            flights.append(
                Flight(group.topic, group.attempt, partition, batch, keys[start:end], values[start:end])
            )
            batch = producer.create_batch()
            append, start = batch.append, end
            append(timestamp=timestamp_ms, key=key, value=value)
    if start:
        keys, values = keys[start:], values[start:]
    flights.append(Flight(group.topic, group.attempt, partition, batch, keys, values))
    return flights
