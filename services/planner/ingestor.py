"""The ingestion pipeline: decode a fetched batch, dead-letter what does not decode, write the rest.

Decoding runs in the consumer's handler; the database write runs in one writer task, so the next
batch decodes while Postgres applies the previous one. The queue between them is bounded: a slow
database slows the consumer, never grows memory. A batch's offsets are committed to the broker only
after its dead letters are acknowledged by the broker and its deltas are committed in Postgres; a crash
anywhere replays at most the uncommitted batches, which the event-id ledger then skips.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Container, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec

from warmplane.services.planner.core.ingest_batch import IngestBatch, NodeKey, fold_events
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.core.node_cache import NodeCache
from warmplane.services.planner.pg_store import WriteResult, event_type
from warmplane.shared.codec import DecodeFailure, EventCodec
from warmplane.shared.events import Event

log = logging.getLogger(__name__)

Offsets = dict[tuple[str, int], int]
"""(topic, partition) -> the next offset to consume, i.e. the last processed offset + 1."""


class RawRecord(Protocol):
    """The parts of a consumed record the pipeline reads (aiokafka's ConsumerRecord has them)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def value(self) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class DeadLetter:
    record: RawRecord
    reason: str


class DeadLetterSink(Protocol):
    async def send_all(self, letters: Sequence[DeadLetter]) -> None:
        """Publish every letter and return once the broker has acknowledged all of them."""


class EventWriter(Protocol):
    async def write(self, events: list[Event], fold: Callable[[list[Event]], IngestBatch]) -> WriteResult: ...


CommitOffsets = Callable[[Offsets], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class _Work:
    events: list[Event]
    letters: list[DeadLetter]
    offsets: Offsets
    commit: CommitOffsets


class Ingestor:
    """Owns the writer task. `submit` from the consumer; `drain` before the consumer closes."""

    def __init__(
        self,
        *,
        codec: EventCodec,
        writer: EventWriter,
        dead_letters: DeadLetterSink,
        metrics: PlannerMetrics,
        bucket_seconds: int,
        node_cache: NodeCache,
        max_payload_bytes: int,
        queue_depth: int = 2,
    ) -> None:
        self._codec = codec
        self._writer = writer
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._bucket_seconds = bucket_seconds
        self._nodes = node_cache
        self._max_payload_bytes = max_payload_bytes
        self._queue: asyncio.Queue[_Work | None] = asyncio.Queue(maxsize=queue_depth)
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="planner-writer")

    async def submit(self, records: Sequence[RawRecord], commit: CommitOffsets) -> None:
        """Decode `records` and queue them for writing; waits while the queue is full.

        Raises the writer's error if the writer has died, so the consumer stops instead of
        consuming batches it cannot write.
        """
        if self._failure is not None:
            raise RuntimeError("the planner's writer has stopped") from self._failure
        events: list[Event] = []
        letters: list[DeadLetter] = []
        offsets: Offsets = {}
        decode = self._codec.decode
        for record in records:
            decoded = decode(record.value)
            if isinstance(decoded, DecodeFailure):
                letters.append(DeadLetter(record, decoded.reason))
            elif (too_big := self._oversized_payload(decoded, record)) is not None:
                letters.append(DeadLetter(record, too_big))
            else:
                events.append(decoded)
            key = (record.topic, record.partition)
            if record.offset >= offsets.get(key, -1):
                offsets[key] = record.offset + 1
        await self._queue.put(_Work(events, letters, offsets, commit))

    def _oversized_payload(self, event: Event, record: RawRecord) -> str | None:
        """Why the event's catalog payload is refused, if it is; cheap for messages under the cap."""
        if record.value is None or len(record.value) <= self._max_payload_bytes:
            return None
        payload = getattr(event, "payload", None)
        size = len(msgspec.json.encode(payload)) if payload is not None else 0
        if size <= self._max_payload_bytes:
            return None
        return f"payload of {size} bytes exceeds catalog_max_payload_bytes={self._max_payload_bytes}"

    async def drain(self) -> None:
        """Write everything queued, commit its offsets, and stop the writer task."""
        if self._task is None:
            return
        await self._queue.put(None)
        await self._task
        self._task = None

    async def _run(self) -> None:
        while (work := await self._queue.get()) is not None:
            try:
                await self._process(work)
            except BaseException as exc:
                self._failure = exc
                log.exception("planner writer failed; the consumer will stop")
                raise

    async def _process(self, work: _Work) -> None:
        if work.letters:
            await self._dead_letters.send_all(work.letters)
            for letter in work.letters:
                self._metrics.dead_lettered.labels(reason=_reason_class(letter.reason)).inc()
        if work.events:
            with self._metrics.batch_seconds.time():
                result = await self._writer.write(work.events, self._fold)
            self._nodes.add_all(result.applied.edges.keys())
            self._metrics.duplicates.inc(result.duplicates)
            for kind, count in Counter(type(event) for event in work.events).items():
                self._metrics.events.labels(type=event_type(kind)).inc(count)
        try:
            await work.commit(work.offsets)
        except Exception:  # the ledger makes a replay harmless; keep going
            self._metrics.commit_failures.inc()
            log.warning("offset commit failed; the batch will be replayed and skipped", exc_info=True)

    def _fold(self, events: list[Event]) -> IngestBatch:
        stored: Container[NodeKey] = self._nodes
        return fold_events(events, bucket_seconds=self._bucket_seconds, stored_nodes=stored)


def _reason_class(reason: str) -> str:
    """A bounded label for a free-text reason (metric label values must not explode)."""
    for prefix, label in (
        ("schema_version", "future_schema"),
        ("unknown event type", "unknown_type"),
        ("message of", "oversized"),
        ("payload of", "oversized_payload"),
        ("not a JSON", "malformed"),
        ("empty message", "empty"),
    ):
        if reason.startswith(prefix):
            return label
    return "invalid"
