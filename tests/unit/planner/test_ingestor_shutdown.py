"""A planner whose writer died still shuts down: draining or flushing never waits on a dead writer.

Seen in the two-planner bench before the fix: a database error killed the writer, the queue stayed
full, and `drain()` waited forever to enqueue its stop marker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tests.unit.planner.ingestor_fakes import Consumer, Record, request_record, started_ingestor
from tests.unit.planner.memory_ingest import MemoryIngest
from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.pg_store import PartitionSlice


class BrokenStore(MemoryIngest):
    """A database whose first write hangs until `fail` is set, then fails."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.writing = asyncio.Event()
        self.fail = asyncio.Event()

    async def write(self, slices: Sequence[PartitionSlice], batch: IngestBatch) -> None:
        self.writes += 1
        self.writing.set()
        await self.fail.wait()
        raise RuntimeError("the database went away")


def _records(first_offset: int, count: int) -> list[Record]:
    return [request_record(first_offset + i, [1, 2]) for i in range(count)]


async def test_drain_and_flush_return_when_the_writer_has_died() -> None:
    store = BrokenStore()
    writer_died = asyncio.Event()
    ingestor = started_ingestor(store, queue_depth=1, on_failure=writer_died.set)
    await ingestor.submit(_records(0, 3), Consumer())
    await asyncio.wait_for(store.writing.wait(), 5)
    await ingestor.submit(_records(3, 3), Consumer())  # the queue (depth 1) is now full
    store.fail.set()
    await asyncio.wait_for(writer_died.wait(), 5)

    await asyncio.wait_for(ingestor.flush(), 5)
    await asyncio.wait_for(ingestor.drain(), 5)
    assert store.writes == 1
