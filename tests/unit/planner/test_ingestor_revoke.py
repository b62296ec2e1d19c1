"""Two consumer groups feed one ingestor (the traffic's and the lifecycle's, `app.py`). While one group's
partitions are revoked, `flush` skips that group's broker commits only: a batch of the other group written
meanwhile commits its offsets, or a partition that gets no further record would keep a stale broker
offset, seen as lag."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from tests.unit.planner.ingestor_fakes import Consumer, Record, request_record, started_ingestor
from tests.unit.planner.memory_ingest import MemoryIngest
from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.ingestor import Offsets
from warmplane.services.planner.pg_store import PartitionSlice


class HeldStore(MemoryIngest):
    """Writes once `go` is set, telling when the first write began."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = asyncio.Event()
        self.go = asyncio.Event()

    async def write(self, slices: Sequence[PartitionSlice], batch: IngestBatch) -> None:
        self.writing.set()
        await self.go.wait()
        await super().write(slices, batch)


class GroupConsumer(Consumer):
    """A consumer of group `group` noting the offsets it commits to the broker."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.committed: list[Offsets] = []

    async def commit(self, offsets: Offsets) -> None:
        self.committed.append(offsets)


def _lifecycle(offset: int) -> Record:
    return dataclasses.replace(request_record(offset, [9]), topic="t.lifecycle")


async def test_a_flush_for_one_group_skips_its_commits_and_not_the_other_group_s() -> None:
    store = HeldStore()
    ingestor = started_ingestor(store)
    traffic, lifecycle = GroupConsumer("planner"), GroupConsumer("planner-lifecycle")
    await ingestor.submit([request_record(0, [1, 2])], traffic)
    await asyncio.wait_for(store.writing.wait(), 5)  # the writer holds the traffic's batch
    await ingestor.submit([_lifecycle(0)], lifecycle)
    revoked = asyncio.create_task(ingestor.flush("planner"))  # the traffic's group rebalances
    await asyncio.sleep(0)
    assert not revoked.done()  # it waits for both batches to be written
    store.go.set()
    await asyncio.wait_for(revoked, 5)
    assert store.offsets == {("t.requests", 0): 1, ("t.lifecycle", 0): 1}  # both written
    assert traffic.committed == []  # its group was being revoked: Postgres alone holds the position
    assert lifecycle.committed == [{("t.lifecycle", 0): 1}]

    # The revocation over, the traffic's group commits again.
    await ingestor.submit([request_record(1, [1, 3])], traffic)
    await asyncio.wait_for(ingestor.flush(), 5)
    assert traffic.committed == [{("t.requests", 0): 2}]
    await ingestor.drain()


async def test_after_drain_begins_no_group_commits_to_the_broker() -> None:
    store = HeldStore()
    ingestor = started_ingestor(store)
    traffic, lifecycle = GroupConsumer("planner"), GroupConsumer("planner-lifecycle")
    await ingestor.submit([request_record(0, [1, 2])], traffic)
    await ingestor.submit([_lifecycle(0)], lifecycle)
    draining = asyncio.create_task(ingestor.drain())
    await asyncio.sleep(0)
    store.go.set()
    await asyncio.wait_for(draining, 5)
    assert store.offsets == {("t.requests", 0): 1, ("t.lifecycle", 0): 1}
    assert traffic.committed == lifecycle.committed == []
