"""The writer rides out an unreachable Postgres: it writes the batch again, commits no broker offset before
the database has the batch, never counts a batch twice (one that had committed is fenced by its own
positions), and stops the planner once the outage outlasts `db_outage_s`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from tests.unit.planner.ingestor_fakes import Consumer, request_record, started_ingestor
from tests.unit.planner.memory_ingest import MemoryIngest
from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.ingestor import Offsets, Partition
from warmplane.services.planner.pg_store import PartitionSlice

PARTITION = ("t.requests", 0)


class FlakyStore(MemoryIngest):
    """The twin of Postgres, whose next writes go as `failures` says, one each: `down` (refused, nothing
    written), `dropped` (committed, then the connection dropped before the answer), or ""."""

    def __init__(self, failures: Sequence[str]) -> None:
        super().__init__()
        self.failures = list(failures)
        self.attempts = 0

    @property
    def position(self) -> int:
        return self.offsets.get(PARTITION, 0)

    @property
    def counted(self) -> int:
        return sum(requests for _scope, _leaf, _bucket, requests in self.plans.counts)

    async def write(self, slices: Sequence[PartitionSlice], batch: IngestBatch) -> None:
        self.attempts += 1
        failure = self.failures.pop(0) if self.failures else None
        if failure == "down":
            raise ConnectionRefusedError(111, "Connect call failed")
        await super().write(slices, batch)
        if failure == "dropped":
            raise ConnectionResetError(104, "Connection reset by peer")


class Broker(Consumer):
    def __init__(self, store: FlakyStore) -> None:
        self.store = store
        self.committed: Offsets = {}
        self.seeks: list[int] = []

    async def commit(self, offsets: Offsets) -> None:
        assert offsets[PARTITION] <= self.store.position, "a broker offset ahead of Postgres"
        self.committed = offsets

    def seek(self, partition: Partition, offset: int) -> None:
        self.seeks.append(offset)


async def _until(check: Callable[[], bool], what: str) -> None:
    """Until `check()`; fail naming `what` after 10 s."""
    try:
        async with asyncio.timeout(10):
            while not check():  # noqa: ASYNC110 - the fakes' state has no event to wait on
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def test_a_batch_is_written_again_once_postgres_answers_and_counted_once() -> None:
    store, died = FlakyStore(["down", "down", "", "dropped"]), asyncio.Event()
    broker = Broker(store)
    ingestor = started_ingestor(store, queue_depth=1, db_outage_s=30, on_failure=died.set)
    await ingestor.submit([request_record(i, [1, 2]) for i in range(3)], broker)
    await _until(lambda: store.position == 3, "the first batch stored")
    await ingestor.submit([request_record(3 + i, [1, 2]) for i in range(2)], broker)
    # The second batch's commit went through, then its answer was lost: written again, it is fenced,
    # and the partition is re-read from where Postgres says it stands.
    await _until(lambda: broker.seeks == [5], "the re-read after the fence")
    await ingestor.drain()
    assert not died.is_set()
    assert (store.counted, store.position) == (5, 5)
    assert broker.committed == {PARTITION: 3}, "the fenced batch commits nothing; the next read will"


async def test_an_outage_longer_than_the_bound_stops_the_planner() -> None:
    store, died = FlakyStore(["down"] * 100), asyncio.Event()
    broker = Broker(store)
    ingestor = started_ingestor(store, queue_depth=1, db_outage_s=0.5, on_failure=died.set)
    await ingestor.submit([request_record(0, [1, 2])], broker)
    await asyncio.wait_for(died.wait(), 10)
    assert 2 <= store.attempts <= 4 and store.counted == 0 and broker.committed == {}
    await asyncio.wait_for(ingestor.drain(), 5)
