"""The emitter's view of a Kafka producer: a small Protocol, its aiokafka adapter, and Java's partitioner.

The emitter builds record batches itself and picks each batch's partition, so it needs only a handful of
producer methods (`BatchProducer`); unit tests hand it an in-memory twin instead of `AiokafkaBatchProducer`.
Partitions are chosen as Kafka's Java default partitioner does for keyed records, so every producer of a
topic, in any language, puts one key on one partition.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, cast

from aiokafka import AIOKafkaProducer, codec
from aiokafka.errors import ProducerClosed

log = logging.getLogger(__name__)

_SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_MASK: Final = 0xFFFFFFFF
_WORDS: Final = struct.Struct("<I")


class RecordBatch(Protocol):
    """A batch being filled: `append` returns None once the batch is full (it then stays closed)."""

    def append(self, *, timestamp: int | None, key: bytes | None, value: bytes | None) -> object | None: ...

    def record_count(self) -> int: ...


class BatchProducer(Protocol):
    """The producer calls the emitter makes. Each may raise; the emitter bounds each with a timeout."""

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """Deliver what was handed over, then disconnect."""

    async def partitions_for(self, topic: str) -> set[int]: ...

    def create_batch(self) -> RecordBatch: ...

    async def send_batch(self, batch: RecordBatch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        """Queue `batch`; the returned future resolves when the broker acknowledged it, or fails."""

    def fail_pending(self) -> None:
        """Fail every batch not yet acknowledged, so that `stop()` returns without waiting for them."""


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """What a producer factory needs. Idempotence is always off: Tansu refuses it, and the emitter's own
    retries could duplicate anyway (consumers deduplicate by `event_id`)."""

    bootstrap_servers: str
    client_id: str
    acks: Literal["all", 1]
    compression: Literal["gzip", "lz4", "zstd"] | None
    request_timeout_ms: int
    max_batch_bytes: int
    retry_backoff_ms: int
    connections: int = 1
    security: Mapping[str, Any] = field(default_factory=dict)
    """aiokafka's connection options (`kafka_clients.client_security`): TLS, SASL."""


ProducerFactory = Callable[[ProducerConfig], BatchProducer]


def check_compression(compression: str | None) -> None:
    """Raise `ValueError` if aiokafka cannot compress with `compression` here (its library is missing)."""
    available = {None: True, "gzip": codec.has_gzip(), "lz4": codec.has_lz4(), "zstd": codec.has_zstd()}
    if not available.get(compression, False):
        raise ValueError(f"compression {compression!r} is not available: install its library for aiokafka")


class AiokafkaBatchProducer:
    """`BatchProducer` over `config.connections` `AIOKafkaProducer`s. Build it inside the running loop.

    aiokafka keeps one produce request in flight per broker connection, so the client waits while the
    broker works; a second connection overlaps the two (raw send_batch on Tansu, 630-byte events: about
    200-250k/s with one, 250-400k/s with two). Partition `p` always goes through connection
    `p % connections`, which keeps each partition in order.
    """

    def __init__(self, config: ProducerConfig) -> None:
        self._producers = [
            AIOKafkaProducer(
                bootstrap_servers=config.bootstrap_servers,
                **config.security,
                client_id=config.client_id,
                acks=config.acks,
                compression_type=config.compression,
                request_timeout_ms=config.request_timeout_ms,
                max_batch_size=config.max_batch_bytes,
                retry_backoff_ms=config.retry_backoff_ms,
                enable_idempotence=False,
                linger_ms=0,  # the emitter lingers itself, before it builds a batch
            )
            for _ in range(config.connections)
        ]
        self._aborted = False

    async def start(self) -> None:
        # Let every start finish (or fail) before reporting, so that stop() never races a start.
        results = await asyncio.gather(
            *(producer.start() for producer in self._producers), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def stop(self) -> None:
        results = await asyncio.gather(
            *(producer.stop() for producer in self._producers), return_exceptions=True
        )
        for producer, result in zip(self._producers, results, strict=True):
            if isinstance(result, BaseException):
                # After fail_pending(), aiokafka's stop() can fail half-way (a request in flight finds its
                # batch already failed, a KeyError) before closing its connections: close them here.
                await producer.client.close()
                if not self._aborted:
                    raise result

    async def partitions_for(self, topic: str) -> set[int]:
        """From aiokafka's metadata cache (refreshed every `metadata_max_age_ms`); fetched on a miss."""
        partitions: set[int] = await self._producers[0].partitions_for(topic)
        return partitions

    def create_batch(self) -> RecordBatch:
        batch: RecordBatch = self._producers[0].create_batch()  # builders of all connections are alike
        return batch

    async def send_batch(self, batch: RecordBatch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        producer = self._producers[partition % len(self._producers)]
        future: asyncio.Future[Any] = await producer.send_batch(batch, topic, partition=partition)
        return future

    def fail_pending(self) -> None:
        # aiokafka's stop() waits until every queued batch is delivered or expires (request_timeout_ms), and
        # offers no public way to give up sooner; close() has a deadline, so this reaches into it. Failing a
        # batch nobody drained also fails its drain waiter, which nobody awaits: mark those as retrieved.
        self._aborted = True
        for producer in self._producers:
            accumulator = getattr(producer, "_message_accumulator", None)
            if accumulator is None:
                continue
            queued = [batch for batches in getattr(accumulator, "_batches", {}).values() for batch in batches]
            accumulator.fail_all(ProducerClosed())
            for batch in queued:
                waiter = getattr(batch, "_drain_waiter", None)
                if waiter is not None and waiter.done() and not waiter.cancelled():
                    waiter.exception()


def aiokafka_factory(config: ProducerConfig) -> BatchProducer:
    """The default `ProducerFactory`."""
    return AiokafkaBatchProducer(config)


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of `data` as an unsigned 32-bit int (Java's `Utils.murmur2`, reinterpreted).

    About 3-4 µs for a 50-byte key in CPython; `KeyHashCache` keeps repeated keys off this path.
    """
    length = len(data)
    h = _SEED ^ length
    end = length & ~3
    for (word,) in _WORDS.iter_unpack(data[:end]):
        k = (word * _M) & _MASK
        k ^= k >> 24
        h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    tail = length & 3
    if tail == 3:
        h ^= data[end + 2] << 16
    if tail >= 2:
        h ^= data[end + 1] << 8
    if tail >= 1:
        h = ((h ^ data[end]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def java_partition(key: bytes, partitions: int) -> int:
    """The partition index Java's default partitioner gives a keyed record: toPositive(murmur2) mod n."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class KeyHashCache:
    """Positive murmur2 of recent keys. Keys repeat (tenant, model, root prefix), murmur2 in Python does not
    pay for itself; `max_entries` bounds memory (the cache is emptied when full: simple, and rare)."""

    def __init__(self, max_entries: int) -> None:
        self._max_entries = max_entries
        self._hashes: dict[bytes, int] = {}

    def get(self, key: bytes) -> int | None:
        """The cached positive hash of `key`, or None."""
        return self._hashes.get(key)

    def positive_hashes(self, keys: list[bytes]) -> list[int]:
        """The positive hash of each of `keys`, in order."""
        hashes = list(map(self._hashes.get, keys))
        if None in hashes:
            return [
                self.compute(key) if cached is None else cached
                for key, cached in zip(keys, hashes, strict=True)
            ]
        return cast(list[int], hashes)  # no None in it, as checked above

    def compute(self, key: bytes) -> int:
        """Hash `key`, remember it, and return it (positive: 0 ≤ hash < 2**31)."""
        positive = murmur2(key) & 0x7FFFFFFF
        if self._max_entries:
            if len(self._hashes) >= self._max_entries:
                self._hashes.clear()
            self._hashes[key] = positive
        return positive


async def stop_producer(producer: BatchProducer, timeout_s: float) -> None:
    """Stop `producer` in about `timeout_s`: half to deliver what it holds, half after failing the rest."""
    stopping = asyncio.ensure_future(producer.stop())
    done, _ = await asyncio.wait({stopping}, timeout=timeout_s / 2)
    if not done:
        producer.fail_pending()
        done, _ = await asyncio.wait({stopping}, timeout=timeout_s / 2)
    if not done:
        stopping.cancel()
        log.error("the Kafka producer did not stop within %.1f s; abandoned it", timeout_s)
    elif stopping.exception() is not None:
        log.warning("stopping the Kafka producer failed: %r", stopping.exception())
