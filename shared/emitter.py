"""The event emitter a serving stack embeds: `emit()` costs microseconds and never blocks or raises.

    async with Emitter(kafka_settings, emitter_settings, Topics(kafka_settings.topic_prefix)) as emitter:
        emitter.emit(event)           # False (and counted) if the event was dropped

`emit()` encodes the event, appends it to a bounded in-memory buffer and returns; a background task
(`emitter_sender.py`) batches the buffer per topic-partition and sends it. When the broker is down or
slow the buffer fills and further events are dropped and counted (`stats.dropped`): serving never waits
for Kafka. Delivery is at least once within `send_retries` (a retried batch may land twice, or after a
newer one); consumers deduplicate by `event_id`.

Threading: `emit()` belongs to the event loop's thread (it may run before `start()`, with no loop yet).
Another thread hands events over with `loop.call_soon_threadsafe(emitter.emit, event)`.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Self

import msgspec
from prometheus_client import CollectorRegistry

from warmplane.shared.codec import EventCodec
from warmplane.shared.emitter_kafka import (
    ProducerConfig,
    ProducerFactory,
    aiokafka_factory,
    check_compression,
)
from warmplane.shared.emitter_ledger import DropReason, EmitterStats, Ledger, TopicQueue
from warmplane.shared.emitter_metrics import EmitterCollector
from warmplane.shared.emitter_sender import Sender
from warmplane.shared.events import Event
from warmplane.shared.kafka_clients import client_security
from warmplane.shared.settings import EmitterSettings, KafkaSettings
from warmplane.shared.topics import Topics, partition_key

__all__ = ["DropReason", "Emitter", "EmitterStats"]

log = logging.getLogger(__name__)

#: Share of close()'s budget for flushing; the rest is for stopping the producer.
_FLUSH_SHARE = 0.8


class Emitter:
    """Publishes events to their topics (`Topics.for_event`), keyed by `partition_key`, in batches.

    Bounds: at most `settings.buffer_max_events` events and `buffer_max_bytes` encoded bytes are held
    (queued, in flight or awaiting a retry). An event whose encoding exceeds `kafka.max_event_bytes` is
    dropped (`too_large`); a catalog `payload` whose encoding exceeds `settings.max_payload_bytes` is
    removed and the event sent without it (`stats.payloads_stripped`).

    `producer_factory` builds the Kafka producer (default: aiokafka); unit tests pass an in-memory twin.
    With `metrics_registry`, `warmplane_emitter_*` metrics are read from `stats` at each scrape.
    Raises `ValueError` at construction if `settings.compression` is not available here.
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        settings: EmitterSettings,
        topics: Topics,
        *,
        producer_factory: ProducerFactory = aiokafka_factory,
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        check_compression(settings.compression)
        self._settings = settings
        self._topics = topics
        self._codec = EventCodec(kafka.max_event_bytes)
        self._encode = self._codec.encode
        self._queue_by_type: dict[type[Event], TopicQueue] = {}
        self._max_events = settings.buffer_max_events
        self._max_bytes = settings.buffer_max_bytes
        self._max_payload_bytes = settings.max_payload_bytes
        self._ledger = Ledger()
        self._accepting = True
        config = ProducerConfig(
            bootstrap_servers=kafka.bootstrap_servers,
            client_id=settings.client_id,
            acks="all" if settings.acks == "all" else 1,
            compression=settings.compression,
            request_timeout_ms=kafka.request_timeout_ms,
            max_batch_bytes=settings.batch_max_bytes,
            retry_backoff_ms=int(settings.retry_backoff_min_s * 1000),
            connections=settings.connections,
            security=client_security(kafka.security),
        )
        self._sender = Sender(self._ledger, settings, config, producer_factory)
        self._task: asyncio.Task[None] | None = None
        self._closing: asyncio.Future[None] | None = None
        self._registry = metrics_registry
        self._collector = EmitterCollector(self._ledger.snapshot)
        if metrics_registry is not None:
            metrics_registry.register(self._collector)

    @property
    def stats(self) -> EmitterStats:
        """A snapshot of the counters (see `emitter_ledger` for how they add up)."""
        return self._ledger.snapshot()

    async def start(self) -> None:
        """Launch the sender task and return at once; it connects in the background, retrying while open.

        Never raises because the broker is down. Idempotent; raises `RuntimeError` after `close()`.
        """
        if self._closing is not None:
            raise RuntimeError("the emitter is closed")
        if self._task is None:
            self._task = asyncio.create_task(self._sender.run(), name="warmplane-emitter-sender")

    def emit(self, event: Event) -> bool:
        """Buffer `event` for sending; True if buffered, False if dropped (and counted by reason).

        Never blocks and never raises. Call it from the event loop's thread only.
        """
        ledger = self._ledger
        if ledger.pending_events >= self._max_events:  # 0 once closed
            return self._reject(DropReason.BUFFER_FULL if self._accepting else DropReason.CLOSED)
        try:
            value = self._encode(event)
            queue = self._queue_by_type[type(event)]
            key = partition_key(event)
        except Exception:
            return self._emit_slowly(event)
        size = len(value)
        if size > self._max_payload_bytes or ledger.pending_bytes + size > self._max_bytes:
            return self._emit_slowly(event)
        queue.keys.append(key)
        queue.values.append(value)
        ledger.pending_events += 1
        ledger.pending_bytes += size
        if ledger.sender_idle:
            ledger.wake_sender()
        return True

    def _emit_slowly(self, event: Event) -> bool:
        """The rare path: the first event of its type, an unencodable or too large event, an oversized
        payload, a buffer full in bytes. Classifies what the fast path only noticed."""
        try:
            topic = self._topics.for_event(event)
            key = partition_key(event)
            value = msgspec.json.encode(event)
            payload = getattr(event, "payload", None)
            stripped = False
            oversized = len(value) > self._max_payload_bytes and payload is not None
            if oversized and len(msgspec.json.encode(payload)) > self._max_payload_bytes:
                value = msgspec.json.encode(msgspec.structs.replace(event, payload=None))
                stripped = True
        except Exception as exc:
            return self._reject(DropReason.ENCODE_ERROR, exc)
        if len(value) > self._codec.max_event_bytes:
            return self._reject(DropReason.TOO_LARGE)
        if self._ledger.pending_bytes + len(value) > self._max_bytes:
            return self._reject(DropReason.BUFFER_FULL)
        # The topic depends on the event's class only (its FAMILY): later events of this type skip the lookup.
        queue = self._queue_by_type[type(event)] = self._ledger.queue_for(topic)
        queue.keys.append(key)
        queue.values.append(value)
        self._ledger.payloads_stripped += stripped
        self._ledger.pending_events += 1
        self._ledger.pending_bytes += len(value)
        self._ledger.wake_sender()
        return True

    def _reject(self, reason: DropReason, error: Exception | None = None) -> bool:
        dropped = self._ledger.dropped[reason] = self._ledger.dropped[reason] + 1
        if dropped & (dropped - 1) == 0:  # log the 1st, 2nd, 4th, 8th... drop: visible, never a flood
            cause = "" if error is None else f": {error!r}"
            log.warning("emitter dropped an event (%s, %d so far)%s", reason.value, dropped, cause)
        return False

    async def close(self, timeout_s: float | None = None) -> None:
        """Stop accepting, flush within `timeout_s` (default `close_timeout_s`), stop the producer.

        What is still buffered at the deadline is counted as dropped (`shutdown`). Idempotent; a second
        call waits for the first. Returns within about `timeout_s`.
        """
        if self._closing is None:
            budget = self._settings.close_timeout_s if timeout_s is None else timeout_s
            self._closing = asyncio.ensure_future(self._close(budget))
        await asyncio.shield(self._closing)

    async def _close(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._accepting = False
        self._max_events = 0
        self._sender.finish()
        task = self._task
        if task is not None:
            await asyncio.wait({task}, timeout=timeout_s * _FLUSH_SHARE)
            if not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=max(deadline - loop.time(), 0.0) / 2)
        await self._sender.release(max(deadline - loop.time(), 0.0))
        self._ledger.drop_queued(DropReason.SHUTDOWN)
        if self._registry is not None:
            self._registry.unregister(self._collector)
        stats = self._ledger.snapshot()
        log.info(
            "emitter closed: %d emitted, %d sent, %d dropped %s, %d payloads stripped",
            stats.emitted,
            stats.sent,
            stats.dropped_total,
            {reason.value: count for reason, count in stats.dropped.items() if count},
            stats.payloads_stripped,
        )

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
