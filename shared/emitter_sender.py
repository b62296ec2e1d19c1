"""The emitter's background task: connect, drain the ledger into per-partition batches, retry boundedly.

One task per emitter, on the emitter's event loop. It never raises to its owner: a broker that is down is
retried (connection: forever while the emitter is open; a batch: `send_retries` times) while `emit()` keeps
buffering up to its bounds and counting what it refuses. Every event taken off the queue belongs to a
`Flight` in `_unsettled` until it is settled as sent or lost, so accounts stay exact even when `close()`
cancels the task mid-way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from functools import partial
from typing import Any

from warmplane.shared.emitter_batches import Flight, split_into_batches
from warmplane.shared.emitter_kafka import (
    BatchProducer,
    KeyHashCache,
    ProducerConfig,
    ProducerFactory,
    stop_producer,
)
from warmplane.shared.emitter_ledger import DropReason, Ledger, value_bytes
from warmplane.shared.settings import EmitterSettings

log = logging.getLogger(__name__)


class Sender:
    """Moves events from a `Ledger` to Kafka through a `BatchProducer` built by `factory`.

    Lifecycle: `run()` as a task; `finish()` asks it to flush and return; then `release()` stops the
    producer and settles whatever is left as lost (`shutdown`), whether `run()` returned or was cancelled.
    """

    def __init__(
        self, ledger: Ledger, settings: EmitterSettings, config: ProducerConfig, factory: ProducerFactory
    ) -> None:
        self._ledger = ledger
        self._settings = settings
        self._config = config
        self._factory = factory
        self._hashes = KeyHashCache(settings.key_hash_cache_size)
        self._producer: BatchProducer | None = None
        self._finishing = False
        self._releasing = False
        self._finished = asyncio.Event()
        self._unsettled: set[Flight] = set()
        self._retry_ready: deque[Flight] = deque()
        self._oldest = time.monotonic()

    def finish(self) -> None:
        """Stop lingering and reconnecting; `run()` returns once everything buffered is settled."""
        self._finishing = True
        self._finished.set()
        self._ledger.wake_sender()

    async def run(self) -> None:
        """Connect, then send until `finish()` and all settled. Cancellation is the only way it ends early."""
        producer = await self._connect()
        while producer is not None:
            try:
                await self._pump(producer)
                return
            except Exception:
                log.exception("the emitter's sender failed unexpectedly; resuming")
                await self._pause(self._settings.retry_backoff_max_s)

    async def release(self, timeout_s: float) -> None:
        """Stop the producer within `timeout_s` (failing undelivered batches if need be); settle the rest."""
        self._releasing = True  # from now on a failed batch is lost to the shutdown, not retried
        producer, self._producer = self._producer, None
        if producer is not None:
            await stop_producer(producer, timeout_s)
        for flight in list(self._unsettled):
            self._settle(flight, None if _acknowledged(flight.delivery) else DropReason.SHUTDOWN)
        self._retry_ready.clear()
        self._ledger.connected = False

    async def _connect(self) -> BatchProducer | None:
        attempt = 0
        while True:
            producer: BatchProducer | None = None
            try:
                producer = self._producer = self._factory(self._config)
                async with asyncio.timeout(self._settings.connect_timeout_s):
                    await producer.start()
            except Exception as exc:
                self._producer = None
                log.warning(
                    "cannot connect to Kafka at %s (attempt %d): %r",
                    self._config.bootstrap_servers,
                    attempt,
                    exc,
                )
                if producer is not None:
                    await stop_producer(producer, self._settings.connect_timeout_s)
                if self._finishing:
                    return None
                await self._pause(self._backoff(attempt))
                attempt += 1
                continue
            self._ledger.connected = True
            log.info("emitter connected to Kafka at %s", self._config.bootstrap_servers)
            return producer

    async def _pump(self, producer: BatchProducer) -> None:
        ledger = self._ledger
        while True:
            queued = ledger.queued()
            if self._retry_ready:
                await self._resend(producer)
            elif queued:
                if queued < self._settings.batch_max_events and not self._finishing:
                    await self._linger()
                await self._send_cycle(producer)
            elif self._finishing and not self._unsettled:
                return
            else:
                ledger.sender_idle = True
                ledger.wake.clear()
                await ledger.wake.wait()
                self._oldest = time.monotonic()  # the queues were empty until this wake-up
                continue
            # send_batch rarely suspends: yield so the serving code on this loop runs between cycles.
            await asyncio.sleep(0)

    async def _linger(self) -> None:
        """Wait until the oldest queued event is `linger_ms` old (a lower bound of its age is tracked)."""
        wait_s = self._oldest + self._settings.linger_ms / 1000 - time.monotonic()
        if wait_s > 0:
            await asyncio.sleep(wait_s)

    async def _send_cycle(self, producer: BatchProducer) -> None:
        """Take up to `batch_max_events` events of each topic off its queue, and send them."""
        started = time.monotonic()
        groups: list[Flight] = []
        left = 0
        for topic, queue in self._ledger.queues.items():
            if queue.keys:
                keys, values = queue.take(self._settings.batch_max_events)
                groups.append(self._hold(Flight(topic, 0, keys=keys, values=values)))
                left += len(queue.keys)
        if not left:
            self._oldest = started  # whatever arrives from now on is younger
        timestamp_ms = time.time_ns() // 1_000_000
        for group in groups:
            await self._route(producer, group, timestamp_ms)

    async def _resend(self, producer: BatchProducer) -> None:
        timestamp_ms = time.time_ns() // 1_000_000
        while self._retry_ready:
            flight = self._retry_ready.popleft()
            if not flight.settled:
                await self._route(producer, flight, timestamp_ms)

    async def _route(self, producer: BatchProducer, group: Flight, timestamp_ms: int) -> None:
        """Split `group` (one topic) into a batch per partition and send each; a failure retries the group."""
        try:
            async with asyncio.timeout(self._settings.send_timeout_s):
                partitions = sorted(await producer.partitions_for(group.topic))
            if not partitions:
                raise LookupError(f"topic {group.topic!r} has no partitions")
        except Exception as exc:
            self._failed(group, exc)
            return
        self._unsettled.discard(group)
        flights = split_into_batches(producer, group, partitions, self._hashes, timestamp_ms)
        self._unsettled.update(flights)
        for flight in flights:
            await self._send(producer, flight)

    async def _send(self, producer: BatchProducer, flight: Flight) -> None:
        if flight.batch is None:
            return
        try:
            async with asyncio.timeout(self._settings.send_timeout_s):
                delivery = await producer.send_batch(flight.batch, flight.topic, partition=flight.partition)
        except Exception as exc:
            self._failed(flight, exc)
            return
        flight.delivery = delivery
        delivery.add_done_callback(partial(self._delivered, flight))

    def _delivered(self, flight: Flight, delivery: asyncio.Future[Any]) -> None:
        if flight.settled:
            return
        error = asyncio.CancelledError() if delivery.cancelled() else delivery.exception()
        if error is None:
            self._settle(flight, None)
        else:
            self._failed(flight, error)
        if self._finishing:
            self._ledger.wake_sender()

    def _failed(self, flight: Flight, error: BaseException) -> None:
        """Schedule another attempt after a backoff, or drop the flight's events after `send_retries`."""
        flight.attempt += 1
        flight.batch = flight.delivery = None
        if self._releasing:
            self._settle(flight, DropReason.SHUTDOWN)
            return
        if flight.attempt > self._settings.send_retries:
            log.warning(
                "dropping %d events for %s after %d failed attempts: %r",
                len(flight.keys),
                flight.topic,
                flight.attempt,
                error,
            )
            self._settle(flight, DropReason.SEND_FAILED)
            return
        delay = self._backoff(flight.attempt - 1)
        log.debug("retrying %d events for %s in %.2f s: %r", len(flight.keys), flight.topic, delay, error)
        flight.timer = asyncio.get_running_loop().call_later(delay, self._retry_due, flight)

    def _retry_due(self, flight: Flight) -> None:
        flight.timer = None
        if not flight.settled:
            self._retry_ready.append(flight)
            self._ledger.wake_sender()

    def _hold(self, flight: Flight) -> Flight:
        self._unsettled.add(flight)
        return flight

    def _settle(self, flight: Flight, reason: DropReason | None) -> None:
        flight.settled = True
        self._unsettled.discard(flight)
        if flight.timer is not None:
            flight.timer.cancel()
            flight.timer = None
        if reason is None:
            self._ledger.settle_sent(len(flight.keys), value_bytes(flight.values))
        else:
            self._ledger.settle_lost(reason, len(flight.keys), value_bytes(flight.values))

    def _backoff(self, attempt: int) -> float:
        """Exponential from `retry_backoff_min_s`, capped at `retry_backoff_max_s`, with jitter below it."""
        low, high = self._settings.retry_backoff_min_s, self._settings.retry_backoff_max_s
        ceiling = min(high, low * 2 ** min(attempt, 32))
        return random.uniform(max(low, ceiling / 2), ceiling)

    async def _pause(self, seconds: float) -> None:
        """Sleep `seconds`, or less if `finish()` is called meanwhile."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._finished.wait()


def _acknowledged(delivery: asyncio.Future[Any] | None) -> bool:
    """Whether the broker acknowledged a batch whose done-callback may not have run yet."""
    return (
        delivery is not None and delivery.done() and not delivery.cancelled() and delivery.exception() is None
    )
