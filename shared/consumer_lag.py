"""Consumer lag, read from the consumer itself: no kafka-exporter needed.

A partition's lag is its log end offset minus the consumer's position there (the next offset it hands
to the application). The end is the larger of two readings: the broker's answer to ListOffsets (one
round trip for all partitions), current even when the consumer has stopped fetching (its buffer full
behind a slow handler), where the last fetch's high watermark would read flat while lag grows; and that
high watermark, because Tansu 0.6 (the embedded broker) answers ListOffsets with the last batch's base
offset + 1, short of the end whenever the last write was a batch. What was handed over but not yet
processed (a planner's writer queue) is not lag here.

`report_lag_forever` samples every `interval_s` outside the consumer's own loop, so the hot path pays
nothing; each sample replaces the partitions that consumer reported, so a partition revoked from it stops
being reported by it (another consumer of the group reports it). A service with several consumers (the
planner's two groups) reports all of them into one gauge: they read different topics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError
from prometheus_client import Gauge

log = logging.getLogger(__name__)

Lag = dict[tuple[str, int], int]
"""Events behind, by (topic, partition)."""


async def partition_lag(consumer: AIOKafkaConsumer, timeout_s: float) -> Lag:
    """The lag of each partition assigned to `consumer` that has a position. Raises `TimeoutError` when
    the broker does not answer within `timeout_s`, or what aiokafka raises (`KafkaError`)."""
    assigned = sorted(consumer.assignment())
    if not assigned:
        return {}
    # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a cancellation that arrives as the
    # awaited call completes, and a sampler that survives its cancellation hangs its service's shutdown.
    async with asyncio.timeout(timeout_s):
        ends: dict[TopicPartition, int] = await consumer.end_offsets(assigned)
    lag: Lag = {}
    for tp in assigned:
        try:
            # Returns at once when the position is known; waits while an offset is being reset.
            async with asyncio.timeout(timeout_s):
                position = await consumer.position(tp)
        except (IllegalStateError, TimeoutError):  # revoked meanwhile, or its position not known yet
            continue
        end = max(ends[tp], consumer.highwater(tp) or 0)
        lag[(tp.topic, tp.partition)] = max(0, end - position)
    return lag


class LagGauge:
    """Writes samples to a gauge labelled (topic, partition), dropping partitions no longer reported."""

    def __init__(self, gauge: Gauge) -> None:
        self._gauge = gauge
        self._reported: set[tuple[str, int]] = set()

    def record(self, lag: Lag) -> None:
        for topic, partition in self._reported - lag.keys():
            self._gauge.remove(topic, str(partition))
        for (topic, partition), behind in lag.items():
            self._gauge.labels(topic, str(partition)).set(behind)
        self._reported = set(lag)


async def report_lag_forever(
    consumers: Sequence[Callable[[], AIOKafkaConsumer | None]],
    gauge: Gauge,
    *,
    interval_s: float,
    timeout_s: float,
) -> None:
    """Sample the lag of each of `consumers` (getters: a consumer exists once its broker started) into
    `gauge` every `interval_s` until cancelled; never raises otherwise. A failed sample is logged and
    leaves that consumer's last values."""
    recorders = [LagGauge(gauge) for _ in consumers]
    while True:
        for consumer, recorder in zip(consumers, recorders, strict=True):
            current = consumer()
            if current is None:
                continue
            try:
                recorder.record(await partition_lag(current, timeout_s))
            except Exception as error:
                # A metric must never stop the service (the warmer's /healthz fails once a task ends).
                log.warning("could not read consumer lag: %r", error)
        await asyncio.sleep(interval_s)
