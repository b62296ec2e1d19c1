"""A planner whose writer died still shuts down: draining or flushing never waits on a dead writer.

Seen in the two-planner bench before the fix: a database error killed the writer, the queue stayed
full, and `drain()` waited forever to enqueue its stop marker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.core.node_cache import NodeCache
from warmplane.services.planner.ingestor import Ingestor, Offsets, Partition
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.pg_store import PartitionSlice
from warmplane.shared.codec import EventCodec
from warmplane.shared.dead_letters import DeadLetter
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, RequestObserved


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class BrokenStore:
    """A database whose first write hangs until `fail` is set, then fails."""

    def __init__(self) -> None:
        self.writes = 0
        self.writing = asyncio.Event()
        self.fail = asyncio.Event()

    async def write(self, slices: Sequence[PartitionSlice], batch: IngestBatch) -> None:
        self.writes += 1
        self.writing.set()
        await self.fail.wait()
        raise RuntimeError("the database went away")

    async def positions(self, partitions: Sequence[Partition], window: int) -> dict[Partition, object]:
        return {}


class NoLetters:
    async def send_all(self, letters: Sequence[DeadLetter]) -> None:
        return None


class Consumer:
    async def commit(self, offsets: Offsets) -> None:
        return None

    def seek(self, partition: Partition, offset: int) -> None:
        return None

    def owns(self, partition: Partition) -> bool:
        return True


def _records(first_offset: int, count: int) -> list[Record]:
    codec = EventCodec()
    return [
        Record(
            "t.requests",
            0,
            first_offset + i,
            None,
            codec.encode(
                RequestObserved(
                    event_id=new_event_id(),
                    occurred_at=datetime.now(UTC),
                    producer="test",
                    tenant="acme",
                    model=ModelRef("m"),
                    replica="r",
                    chain=[1, 2],
                    chain_tokens=[10, 20],
                    prompt_tokens=21,
                )
            ),
        )
        for i in range(count)
    ]


async def test_drain_and_flush_return_when_the_writer_has_died() -> None:
    store = BrokenStore()
    writer_died = asyncio.Event()
    ingestor = Ingestor(
        codec=EventCodec(),
        store=store,  # type: ignore[arg-type]
        dead_letters=NoLetters(),
        metrics=PlannerMetrics(CollectorRegistry()),
        node_cache=NodeCache(),
        max_payload_bytes=65_536,
        window_per_partition=1_000,
        queue_depth=1,
        on_failure=writer_died.set,
    )
    ingestor.start()
    await ingestor.submit(_records(0, 3), Consumer())
    await asyncio.wait_for(store.writing.wait(), 5)
    await ingestor.submit(_records(3, 3), Consumer())  # the queue (depth 1) is now full
    store.fail.set()
    await asyncio.wait_for(writer_died.wait(), 5)

    await asyncio.wait_for(ingestor.flush(), 5)
    await asyncio.wait_for(ingestor.drain(), 5)
    assert store.writes == 1
