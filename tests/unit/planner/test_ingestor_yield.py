"""The ingestor's two lanes and its pauses: it awaits its `before_batch` hook (the planning task's
`yield_to_urgent`) before it decodes a fetched batch and before it writes one, so a pause holds both the
consumer and the bulk lane's writer back; records of its urgent topics (the lifecycle topic) are decoded
first, without a pause, and written in a batch of their own by a writer of their own, while the other lane's
batch is being written or paused."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry

from tests.unit.planner.ingestor_fakes import Consumer, Record, request_record, started_ingestor
from tests.unit.planner.memory_ingest import MemoryIngest
from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.pg_store import PartitionSlice
from warmplane.shared.codec import EventCodec
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, ReplicaStarted


class Gate:
    """A `before_batch` that counts its calls and holds each one while `open` is clear."""

    def __init__(self) -> None:
        self.calls = 0
        self.open = asyncio.Event()
        self.open.set()

    async def __call__(self) -> None:
        self.calls += 1
        await self.open.wait()


async def test_a_closed_gate_holds_decoding_and_writing_and_opening_it_counts_every_event_once() -> None:
    store = MemoryIngest()
    gate = Gate()
    ingestor = started_ingestor(store, before_batch=gate)
    await ingestor.submit([request_record(0, [1, 2])], Consumer())
    await asyncio.wait_for(ingestor.flush(), 5)
    assert gate.calls == 2  # once before decoding, once before writing
    assert len(store.plans.counts) == 1

    gate.open.clear()
    submitted = asyncio.create_task(ingestor.submit([request_record(1, [1, 2])], Consumer()))
    await asyncio.sleep(0.05)
    assert not submitted.done() and gate.calls == 3  # decoding waits at the gate
    gate.open.set()
    await asyncio.wait_for(submitted, 5)
    await asyncio.wait_for(ingestor.flush(), 5)
    assert gate.calls == 4 and len(store.plans.counts) == 2
    await ingestor.drain()


class HeldStore(MemoryIngest):
    """Notes each batch's topics as it commits; a batch of the requests topic waits until `go` is set, and
    `written` tells when the lifecycle's committed."""

    def __init__(self) -> None:
        super().__init__()
        self.topics: list[set[str]] = []
        self.writing = asyncio.Event()
        self.go = asyncio.Event()
        self.written = asyncio.Event()

    async def write(self, slices: Sequence[PartitionSlice], batch: IngestBatch) -> None:
        topics = {s.topic for s in slices}
        if "t.requests" in topics:
            self.writing.set()
            await self.go.wait()
        await super().write(slices, batch)
        self.topics.append(topics)
        if "t.lifecycle" in topics:
            self.written.set()


def _lifecycle(offset: int) -> Record:
    return dataclasses.replace(request_record(offset, [9]), topic="t.lifecycle")


async def test_urgent_records_are_written_in_their_own_batch_while_a_request_batch_is_written() -> None:
    store = HeldStore()
    ingestor = started_ingestor(store, urgent_topics=("t.lifecycle",))
    await ingestor.submit([request_record(0, [1, 2])], Consumer())
    await asyncio.wait_for(store.writing.wait(), 5)  # held: the bulk writer is inside this batch
    await ingestor.submit([request_record(1, [1, 2])], Consumer())
    await ingestor.submit([request_record(2, [1, 3]), _lifecycle(0), request_record(3, [1, 4])], Consumer())
    # The lifecycle record commits in a batch of its own while the request batch is still being written.
    await asyncio.wait_for(store.written.wait(), 5)
    assert store.topics == [{"t.lifecycle"}]
    store.go.set()
    await asyncio.wait_for(ingestor.flush(), 5)
    assert store.topics == [{"t.lifecycle"}, {"t.requests"}, {"t.requests"}, {"t.requests"}]
    assert store.offsets == {("t.requests", 0): 4, ("t.lifecycle", 0): 1}
    assert len(store.plans.counts) == 5  # every event counted once
    await ingestor.drain()


async def test_an_urgent_batch_is_written_while_the_bulk_writer_is_paused() -> None:
    store = HeldStore()
    store.go.set()
    writer_pauses, resume = asyncio.Event(), asyncio.Event()
    calls = 0

    async def gate() -> None:  # the consumer's pause (the first call) passes; the writer's waits
        nonlocal calls
        calls += 1
        if calls == 2:
            writer_pauses.set()
            await resume.wait()

    ingestor = started_ingestor(store, before_batch=gate, urgent_topics=("t.lifecycle",))
    await ingestor.submit([request_record(0, [1, 2])], Consumer())
    await asyncio.wait_for(writer_pauses.wait(), 5)  # the writer took the request batch and paused
    await ingestor.submit([_lifecycle(0)], Consumer())  # urgent: decoded without a pause
    await asyncio.wait_for(store.written.wait(), 5)  # and written while the bulk writer waits at the gate
    assert store.topics == [{"t.lifecycle"}]
    resume.set()
    await asyncio.wait_for(ingestor.flush(), 5)
    assert store.topics == [{"t.lifecycle"}, {"t.requests"}]
    assert calls == 2  # the urgent lane passes no gate
    await ingestor.drain()


async def test_a_start_s_way_to_the_handler_is_timed_from_its_producer_s_clock() -> None:
    metrics = PlannerMetrics(CollectorRegistry())
    ingestor = started_ingestor(MemoryIngest(), urgent_topics=("t.lifecycle",), metrics=metrics)
    sent = datetime.now(UTC) - timedelta(seconds=3)
    start = ReplicaStarted(
        event_id=new_event_id(), occurred_at=sent, producer="w", model=ModelRef("m"), replica="r", node="n"
    )
    record = Record("t.lifecycle", 0, 0, None, EventCodec().encode(start))
    await ingestor.submit([record, dataclasses.replace(_lifecycle(1), partition=1)], Consumer())
    await asyncio.wait_for(ingestor.flush(), 5)
    histogram = metrics.registry.get_sample_value
    assert histogram("warmplane_planner_start_delivered_seconds_count") == 1  # the start alone
    assert 3 <= (histogram("warmplane_planner_start_delivered_seconds_sum") or 0) < 60
    await ingestor.drain()
