"""The ingestion pipeline: decode a fetched batch, dead-letter what does not decode, write the rest.

Decoding and de-duplication run in the consumer's handler; the database write runs in a writer task,
so the next batch decodes while Postgres applies the previous one. The queues between them are bounded: a
slow database slows the consumer, never grows memory.

Two lanes, each a queue and a writer of its own: the records of `urgent_topics` (the lifecycle topic: a
replica that started waits for its plan) are decoded first and written beside the other lane's batch, on
a connection of their own. With one writer, a start waited for the request batch being written (tens of
milliseconds under load); in one batch, for all of them to decode and commit. The lanes hold different
partitions, so their order reorders nothing within a partition, and each batch commits its own
partitions' offsets with its counts. Two batches in flight at once are what two planners' are: a
deadlock between them is retried (`PgIngestStore.write`).

Under load, most of a start's way to its commit comes before the handler holds it
(`start_delivered_seconds`; `bench.plan_latency_bench` times the broker's own hop beside it). aiokafka's
fetcher sends no fetch to a broker while records it fetched from any partition there wait unconsumed for
less than its `prefetch_backoff` (not a consumer setting): the requests' records always wait, so a start
read by the same consumer is fetched only once the batches before it are handed out, or after that
backoff. Lowering the backoff shortened the way but cost ingestion throughput (more, smaller fetches), so
the planner reads the lifecycle topic with a consumer of its own (`app.py`), which submits here too.

Exactly-once effects: a batch's counts commit in Postgres together with its partitions' next offsets;
on assignment the consumer seeks to those offsets (`restore`), so a crash replays nothing that was
counted. Duplicates at other offsets (a producer's retry) are recognised by a window of recent event
ids per partition, rebuilt from the ledger on assignment. The broker offset is committed after the
database too, for lag monitoring and for tools that read it.

An unreachable Postgres (a restart, a failover) is ridden out for `db_outage_s`: the writer tries its
batch again with backoff while the bounded queue holds the consumer back. A batch whose commit went
through before the connection dropped is then refused by its own stored positions (`Fenced`) and the
partitions are re-read from there: never counted twice. Past the outage bound the planner stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from bisect import bisect_left
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import groupby
from operator import attrgetter
from typing import Protocol, cast

import asyncpg
import msgspec

from warmplane.services.planner.core.ingest_batch import IngestBatch, fold_events
from warmplane.services.planner.core.node_cache import NodeCache
from warmplane.services.planner.core.recent_ids import RecentIds
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.pg_store import Fenced, PartitionSlice
from warmplane.shared.codec import DecodeFailure, EventCodec
from warmplane.shared.dead_letters import DeadLetter, DeadLetterSink, RawRecord, reason_class
from warmplane.shared.event_signing import SignedTopics
from warmplane.shared.events import Event, ReplicaStarted, event_type

log = logging.getLogger(__name__)

_CHUNK = 512
"""Records decoded between two yields to the event loop: each of the writer's round trips to Postgres
(five a batch) waits for one."""
_partition_of = attrgetter("topic", "partition")
_offset_of = attrgetter("offset")
_UNREACHABLE = (
    OSError,  # a refused or reset connection, and TimeoutError
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # "another operation is in progress": a connection cut mid-statement
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
)
"""What a batch write raises while Postgres cannot be reached or is shutting down or starting up; any
other error stops the writer at once."""
_URGENT, _BULK = 0, 1
"""The lanes' places in `Ingestor._lanes` (module doc)."""
_RETRY_FIRST_S = 0.2
_RETRY_MAX_S = 5.0
Partition = tuple[str, int]
Offsets = dict[Partition, int]
"""(topic, partition) -> the next offset to consume, i.e. the last processed offset + 1."""


class IngestStore(Protocol):
    """What the writer needs of the database (`PgIngestStore`)."""

    async def write(self, slices: Sequence[PartitionSlice], batch: IngestBatch) -> None:
        """Commit `batch` with its partitions' new positions, atomically; `Fenced` if a partition's stored
        position is not the one its slice expects (nothing written)."""
        ...

    async def positions(
        self, partitions: Sequence[Partition], window: int
    ) -> Mapping[Partition, tuple[int, Sequence[uuid.UUID]]]:
        """Each partition's stored next offset and up to `window` recent event ids (absent: never counted)."""
        ...

    async def rejected(
        self, batch_of: Callable[[list[Event]], IngestBatch], events: list[Event]
    ) -> list[int]:
        """The indexes of the events the database refuses to store (nothing written)."""
        ...


class ConsumerPort(Protocol):
    """What the writer needs of the consumer: commit, and rewind a partition after a fence."""

    @property
    def group(self) -> str:
        """The consumer's group: `flush` skips the broker commits of the group being rebalanced only."""
        ...

    async def commit(self, offsets: Offsets) -> None: ...
    def seek(self, partition: Partition, offset: int) -> None: ...
    def owns(self, partition: Partition) -> bool: ...


@dataclass(slots=True)
class _Work:
    consumer: ConsumerPort
    events: list[Event] = field(default_factory=list)
    records: list[RawRecord] = field(default_factory=list)
    letters: list[DeadLetter] = field(default_factory=list)
    slices: dict[Partition, PartitionSlice] = field(default_factory=dict)
    duplicates: int = 0


@dataclass(slots=True)
class _Lane:
    """A lane: its bounded queue of works (None: stop) and the writer task that takes them in order."""

    name: str
    depth: int
    queue: asyncio.Queue[_Work | None] = field(init=False)
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.queue = asyncio.Queue(self.depth)


class Ingestor:
    """Owns the writer tasks and the per-partition windows. `submit` from the consumer's handler,
    `restore` when partitions are assigned, `flush` when they are revoked, `drain` at shutdown."""

    def __init__(
        self,
        *,
        codec: EventCodec,
        signed: SignedTopics | None = None,
        store: IngestStore,
        dead_letters: DeadLetterSink,
        metrics: PlannerMetrics,
        node_cache: NodeCache,
        max_payload_bytes: int,
        window_per_partition: int,
        queue_depth: int = 2,
        urgent_topics: Collection[str] = (),
        db_outage_s: float = 0.0,
        on_failure: Callable[[], None] = lambda: None,
        after_commit: Callable[[IngestBatch, Offsets], Awaitable[None]] | None = None,
        before_batch: Callable[[], Awaitable[object]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._codec = codec
        self._signed = signed
        """Topics (the lifecycle topic) whose unsigned or badly signed records are dead-lettered."""
        self._store = store
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._nodes = node_cache
        self._max_payload_bytes = max_payload_bytes
        self._window_size = window_per_partition
        self._windows: dict[Partition, RecentIds] = {}
        self._restoring: dict[Partition, asyncio.Future[None]] = {}
        self._submitted: Offsets = {}
        """Per partition, the next offset after the last batch submitted to the writer."""
        self._revoking: set[str] = set()
        """Groups whose partitions are being revoked (`flush`): their broker commits are skipped."""
        self._draining = False
        self._urgent_topics = frozenset(urgent_topics)
        self._lanes = (_Lane("urgent", queue_depth), _Lane("bulk", queue_depth))
        """Each lane's queue (at most `queue_depth` works waiting, then the stop marker) and writer task."""
        self._failure: BaseException | None = None
        self._db_outage_s = db_outage_s
        self._on_failure = on_failure
        self._after_commit = after_commit
        """Called with each batch holding records or requests once it committed, and its partitions' next
        offsets, before the next batch is written: it hands the batch's triggers to the planning task
        (`planning.py`) and its counts to the kept reads (`kept_reads.py`), and does not plan."""
        self._before_batch = before_batch
        """Awaited before a batch is decoded and before one is written: the planning task's
        `yield_to_urgent`, so a plan a replica waits for is not slowed down by ingestion."""
        self._clock = clock
        """Seconds, monotonic: how old the node cache's contents are."""

    def start(self) -> None:
        urgent, bulk = self._lanes
        for lane, before in ((urgent, None), (bulk, self._before_batch)):
            if lane.task is None:
                lane.task = asyncio.create_task(self._run(lane, before), name=f"planner-writer-{lane.name}")

    async def restore(self, partitions: Sequence[Partition]) -> Offsets:
        """Load the stored positions and recent ids of newly assigned `partitions`; return where the
        consumer must seek for those this group has counted from before."""
        # The fetcher may deliver records of a new assignment before this returns: submit waits.
        restoring: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for partition in partitions:
            self._restoring[partition] = restoring
        try:
            stored = await self._store.positions(partitions, self._window_size)
            for partition in partitions:
                window = self._windows[partition] = RecentIds(self._window_size)
                self._submitted.pop(partition, None)
                if partition in stored:
                    next_offset, ids = stored[partition]
                    window.extend(event_id.int for event_id in ids)
                    self._submitted[partition] = next_offset
        finally:
            restoring.set_result(None)
            for partition in partitions:
                if self._restoring.get(partition) is restoring:
                    del self._restoring[partition]
        return {partition: stored[partition][0] for partition in stored}

    async def submit(self, records: Sequence[RawRecord], consumer: ConsumerPort) -> None:
        """Decode, de-duplicate and queue `records`, those of `urgent_topics` first and in their own lane;
        waits while a lane is full.

        Raises the writer's error if the writer has died, so the consumer stops instead of
        consuming batches it cannot write.
        """
        if self._failure is not None:
            raise RuntimeError("the planner's writer has stopped") from self._failure
        # A fetch arrives grouped by partition: look up a partition's state once per run of records.
        runs = [(partition, list(run)) for partition, run in groupby(records, key=_partition_of)]
        await self._await_restored({partition for partition, _ in runs})
        urgent = [(partition, run) for partition, run in runs if partition[0] in self._urgent_topics]
        if urgent:
            work = await self._decoded(urgent, consumer)
            self._time_deliveries(work.events)
            await self._lanes[_URGENT].queue.put(work)
            runs = [(partition, run) for partition, run in runs if partition[0] not in self._urgent_topics]
            if not runs:
                return
        if self._before_batch is not None:
            await self._before_batch()
        await self._lanes[_BULK].queue.put(await self._decoded(runs, consumer))

    def _time_deliveries(self, events: Sequence[Event]) -> None:
        """How long each replica start took from its producer to this handler (`start_delivered_seconds`)."""
        now = datetime.now(UTC)
        for event in events:
            if isinstance(event, ReplicaStarted):
                self._metrics.start_delivered_seconds.observe(
                    max(0.0, (now - event.occurred_at).total_seconds())
                )

    async def _decoded(
        self, runs: Sequence[tuple[Partition, list[RawRecord]]], consumer: ConsumerPort
    ) -> _Work:
        """The work of `runs` (each a partition's records, offsets ascending): the events not counted
        before, each partition's slice, the dead letters; the partitions' next offsets move past them."""
        work = _Work(consumer)
        for partition, run in runs:
            expected = self._submitted.get(partition)
            begin = 0
            if expected is not None and run[0].offset < expected:
                # Already counted (or queued): redelivered before a seek. A run's offsets ascend.
                begin = bisect_left(run, expected, key=_offset_of)
                work.duplicates += begin
                if begin == len(run):
                    continue
            window = self._windows.get(partition)
            if window is None:
                window = self._windows[partition] = RecentIds(self._window_size)
            counted = work.slices.get(partition)
            if counted is None:
                first = run[begin].offset
                counted = work.slices[partition] = PartitionSlice(*partition, first, first, expected, [])
            counted.last_offset = run[-1].offset
            for start in range(begin, len(run), _CHUNK):
                if start > begin:
                    # Let the writer's database replies in: decoding a whole batch at once would
                    # stall the round trip of the batch being written by as long.
                    await asyncio.sleep(0)
                self._admit(run[start : start + _CHUNK], window, counted, work)
        for partition, counted in work.slices.items():
            self._submitted[partition] = counted.last_offset + 1
        return work

    def _admit(
        self, records: list[RawRecord], window: RecentIds, counted: PartitionSlice, work: _Work
    ) -> None:
        """Decode `records` (of one partition) and add the events not seen before to `work`.

        The common case, every record a new valid event of a normal size, is checked for in C over
        the whole chunk; only a chunk that fails a check goes record by record.
        """
        values = [record.value for record in records]
        decode = self._codec.decode
        if self._signed is not None and self._signed.checks(records[0].topic):
            refusals = [self._signed.signer.refusal(r.value, r.headers) for r in records]
            decoded = [
                decode(value) if refusal is None else DecodeFailure(refusal)
                for value, refusal in zip(values, refusals, strict=True)
            ]
        else:
            decoded = [decode(value) for value in values]
        # Lengths only once every value decoded: a tombstone's None has none.
        if DecodeFailure in set(map(type, decoded)) or (
            max(map(len, cast(list[bytes], values))) > self._max_payload_bytes
        ):
            self._admit_each(records, decoded, window, counted, work)
            return
        events = cast(list[Event], decoded)
        keys = [event.event_id.int for event in events]  # ints hash in C, UUIDs don't
        fresh = set(keys)
        if len(fresh) < len(keys) or not fresh.isdisjoint(window.ids):
            self._admit_each(records, decoded, window, counted, work)
            return
        window.admit(keys)
        counted.event_ids += keys
        work.events += events
        work.records += records

    def _admit_each(
        self,
        records: list[RawRecord],
        decoded: list[Event | DecodeFailure],
        window: RecentIds,
        counted: PartitionSlice,
        work: _Work,
    ) -> None:
        """`_admit`, record by record: dead letters, oversized payloads, duplicates."""
        seen, fresh = window.ids, set[int]()
        admitted: list[int] = []
        for record, event in zip(records, decoded, strict=True):
            value = record.value
            if isinstance(event, DecodeFailure):
                work.letters.append(DeadLetter(record, event.reason))
            elif (
                value is not None
                and len(value) > self._max_payload_bytes
                and (big := self._oversized_payload(event))
            ):
                work.letters.append(DeadLetter(record, big))
            elif (key := event.event_id.int) in seen or key in fresh:
                work.duplicates += 1
            else:
                fresh.add(key)
                admitted.append(key)
                work.events.append(event)
                work.records.append(record)
        window.admit(admitted)
        counted.event_ids += admitted

    async def _await_restored(self, partitions: set[Partition]) -> None:
        for partition in partitions:
            if partition in self._restoring:
                await self._restoring[partition]
            if partition not in self._windows:  # delivered without an assignment callback
                await self.restore([partition])

    def _oversized_payload(self, event: Event) -> str | None:
        """Why the event's catalog payload is refused, if it is (called for messages over the cap)."""
        payload = getattr(event, "payload", None)
        size = len(msgspec.json.encode(payload)) if payload is not None else 0
        if size <= self._max_payload_bytes:
            return None
        return f"payload of {size} bytes exceeds catalog_max_payload_bytes={self._max_payload_bytes}"

    async def flush(self, revoking: str | None = None) -> None:
        """Return once everything submitted so far is written (or failed).

        Called when the partitions of the consumer group `revoking` are revoked: its consumer is leaving
        or rebalancing, so that group's copy of the offsets on the broker is skipped meanwhile (each
        commit may wait out its timeout against a consumer that is stopping; Postgres holds the positions
        the next owner resumes from). The other group's batches, written meanwhile, commit as ever: a
        partition that gets no further record would otherwise keep a stale broker offset, seen as lag.
        """
        if revoking is not None:
            self._revoking.add(revoking)
        try:
            for lane in self._lanes:
                await self._unless_writer_stops(lane, lane.queue.join())
        finally:
            if revoking is not None:
                self._revoking.discard(revoking)

    async def drain(self) -> None:
        """Write everything queued and stop the writer tasks; the broker's offsets are not updated."""
        self._draining = True
        for lane in self._lanes:
            if lane.task is not None:
                await self._unless_writer_stops(lane, lane.queue.put(None))
        for lane in self._lanes:
            task, lane.task = lane.task, None
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)  # a writer that failed has logged why

    async def _unless_writer_stops(self, lane: _Lane, waiting: Coroutine[object, object, None]) -> None:
        """Await `waiting`, unless `lane`'s writer task ends first: a dead writer empties no queue, and
        waiting on it would hang shutdown (seen: a writer killed by a database error)."""
        pending = asyncio.ensure_future(waiting)
        if lane.task is None:
            await pending
            return
        await asyncio.wait([pending, lane.task], return_when=asyncio.FIRST_COMPLETED)
        if not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending

    async def _run(self, lane: _Lane, before: Callable[[], Awaitable[object]] | None) -> None:
        """`lane`'s writer: its works in order, each after `before` (the bulk lane's pause for planning)."""
        while True:
            work = await lane.queue.get()
            try:
                if work is None:
                    return
                if before is not None:
                    await before()
                await self._process(work)
            except BaseException as exc:
                self._failure = exc
                log.exception("planner writer failed; stopping (Postgres holds where to resume)")
                self._on_failure()
                raise
            finally:
                lane.queue.task_done()

    async def _process(self, work: _Work) -> None:
        await self._send_letters(work.letters)
        batch = self._fold(work.events)
        try:
            try:
                with self._metrics.batch_seconds.time():
                    await self._write(work, batch)
            except asyncpg.DataError:
                batch = await self._without_unstorable(work)
                await self._write(work, batch)
        except Fenced as fenced:
            await self._rewind(work, fenced.partitions)
            return
        self._nodes.add_all(batch.new_nodes, self._clock())
        self._metrics.duplicates.inc(work.duplicates)
        for kind, count in Counter(map(type, work.events)).items():
            self._metrics.events.labels(type=event_type(kind)).inc(count)
        positions = {p: s.last_offset + 1 for p, s in work.slices.items()}
        if (batch.has_records or batch.requests.leaves) and self._after_commit:
            await self._after_commit(batch, positions)
        if self._draining or work.consumer.group in self._revoking:
            return
        try:
            await work.consumer.commit(positions)
        except Exception:  # the database holds the truth; the broker's copy only serves monitoring
            self._metrics.commit_failures.inc()
            log.warning("broker offset commit failed; positions are safe in Postgres", exc_info=True)

    async def _write(self, work: _Work, batch: IngestBatch) -> None:
        """Write `batch`; while Postgres cannot be reached, again after a backoff, for `db_outage_s`."""
        gives_up = time.monotonic() + self._db_outage_s
        delay = _RETRY_FIRST_S
        while True:
            try:
                await self._store.write(list(work.slices.values()), batch)
                return
            except _UNREACHABLE as exc:
                if time.monotonic() + delay > gives_up:
                    raise
                log.warning(
                    "Postgres unreachable (%s); the batch is tried again in %.1f s", _said(exc), delay
                )
                self._metrics.db_retries.inc()
                await asyncio.sleep(delay)
                delay = min(2 * delay, _RETRY_MAX_S)

    async def _send_letters(self, letters: Sequence[DeadLetter]) -> None:
        """Dead letters reach the broker before their batch commits, so none is lost to a crash."""
        if letters:
            await self._dead_letters.send_all(letters)
            for letter in letters:
                self._metrics.dead_lettered.labels(reason=reason_class(letter.reason)).inc()

    async def _without_unstorable(self, work: _Work) -> IngestBatch:
        """Dead-letter the events Postgres refuses (a value it cannot store, such as a NUL inside a
        payload) and return the fold of the rest. Raises if no single event is at fault."""
        rejected = await self._store.rejected(self._fold, work.events)
        if not rejected:
            raise RuntimeError("Postgres refused a batch but none of its events alone")
        letters = []
        for index in sorted(rejected, reverse=True):
            event, record = work.events.pop(index), work.records.pop(index)
            work.slices[(record.topic, record.partition)].event_ids.remove(event.event_id.int)
            letters.append(DeadLetter(record, "rejected by Postgres: a value it cannot store"))
        await self._send_letters(letters)
        return self._fold(work.events)

    async def _rewind(self, work: _Work, partitions: set[Partition]) -> None:
        """After a fence: forget what this batch added, reload, and re-read what this consumer still owns."""
        log.warning(
            "partitions %s are stored past this batch (another consumer counted them, or this batch's commit "
            "went through before its answer was lost); re-reading from Postgres",
            sorted(partitions),
        )
        positions = await self.restore(list(work.slices))
        for partition in work.slices:
            if work.consumer.owns(partition) and partition in positions:
                work.consumer.seek(partition, positions[partition])

    def _fold(self, events: list[Event]) -> IngestBatch:
        self._nodes.forget_expired(self._clock())
        return fold_events(events, stored_nodes=self._nodes.by_scope)


def _said(exc: BaseException) -> str:
    """An error's class and its first line (no query, no DSN)."""
    first_line = str(exc).partition("\n")[0]
    return f"{type(exc).__name__}: {first_line}"[:200]
