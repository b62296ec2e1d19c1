"""One behaviour suite for the planner's ingest store (`ingestor.IngestStore`), run against the memory twin
(`tests/unit/planner/test_ingest_store_memory.py`) and Postgres (`tests/integration/planner/
test_ingest_store_pg.py`): positions fenced per partition, the window of recent ids, refusal, and counts
that add up, read back through the plan store's `statistics` (which both have)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from warmplane.services.planner.core.ingest_batch import IngestBatch, fold_events
from warmplane.services.planner.ingestor import IngestStore
from warmplane.services.planner.pg_store import Fenced, PartitionSlice
from warmplane.services.planner.plan_choice import ChoiceStore, ModelStatistics
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import Event, ModelRef, PrefixPayload, RequestObserved

AT = datetime(2026, 12, 2, 9, 0, 30, tzinfo=UTC)
BUCKET_SECONDS = 60
BUCKET = int(AT.timestamp()) // BUCKET_SECONDS
TOPIC = "t.requests"


@dataclass(frozen=True, slots=True)
class IngestWorld:
    store: IngestStore
    reads: ChoiceStore
    """Reads what the store wrote (its `bucket_seconds` is `BUCKET_SECONDS`)."""


def request(
    leaf: int = 7,
    *,
    tenant: str = "acme",
    at: datetime = AT,
    model: str = "m",
    rev: str = "",
    prompt: str = "",
) -> RequestObserved:
    """A request of `tenant` on `model` over the chain [1, `leaf`], with its leaf's payload (`prompt`, or
    the tenant and leaf)."""
    return RequestObserved(
        event_id=new_event_id(),
        occurred_at=at,
        producer="gateway",
        tenant=tenant,
        model=ModelRef(model, "r1"),
        prompt_rev=rev,
        replica="r-0",
        chain=[1, leaf],
        chain_tokens=[16, 32],
        prompt_tokens=40,
        payload=PrefixPayload(leaf, prompt=prompt or f"{tenant} {leaf}"),
    )


def fold(events: list[Event]) -> IngestBatch:
    return fold_events(events, stored_nodes={})


def a_slice(
    partition: int, first: int, last: int, expected: int | None, events: list[Event]
) -> PartitionSlice:
    return PartitionSlice(TOPIC, partition, first, last, expected, [e.event_id.int for e in events])


def leaf_counts(statistics: ModelStatistics) -> list[tuple[int, int, int]]:
    """(leaf, bucket, requests), in order, whatever the scopes' ids."""
    return sorted((leaf, bucket, requests) for _scope, leaf, bucket, requests in statistics.counts)


async def counted(world: IngestWorld) -> list[tuple[int, int, int]]:
    """`leaf_counts` of model m, from the store's first bucket on."""
    return leaf_counts(await world.reads.statistics("m", 0))


async def a_written_batchs_position_and_ids_are_returned(world: IngestWorld) -> None:
    events: list[Event] = [request(), request()]
    await world.store.write([a_slice(0, 10, 12, None, events)], fold(events))
    positions = await world.store.positions([(TOPIC, 0)], 100)
    assert {p: (next_offset, list(ids)) for p, (next_offset, ids) in positions.items()} == {
        (TOPIC, 0): (13, [e.event_id for e in events])
    }
    assert await counted(world) == [(7, BUCKET, 2)]


async def a_partition_never_counted_is_absent(world: IngestWorld) -> None:
    events: list[Event] = [request()]
    await world.store.write([a_slice(0, 0, 0, None, events)], fold(events))
    assert set(await world.store.positions([(TOPIC, 0), (TOPIC, 1), ("t.other", 0)], 10)) == {(TOPIC, 0)}


async def a_slice_expecting_a_stale_position_is_fenced_and_writes_nothing(world: IngestWorld) -> None:
    first: list[Event] = [request()]
    await world.store.write([a_slice(0, 0, 4, None, first)], fold(first))
    before = await world.store.positions([(TOPIC, 0), (TOPIC, 1)], 10)
    for stale in (None, 3, 6):  # never read, behind, ahead: none is where partition 0 stands (5)
        again: list[Event] = [request(8), request(9)]
        slices = [a_slice(1, 0, 0, None, again[:1]), a_slice(0, 5, 5, stale, again[1:])]
        with pytest.raises(Fenced) as fenced:
            await world.store.write(slices, fold(again))
        assert (TOPIC, 0) in fenced.value.partitions
    assert await world.store.positions([(TOPIC, 0), (TOPIC, 1)], 10) == before, "partition 1 not started"
    assert await counted(world) == [(7, BUCKET, 1)]


async def a_slice_expecting_the_stored_position_moves_it(world: IngestWorld) -> None:
    first: list[Event] = [request()]
    second: list[Event] = [request()]
    await world.store.write([a_slice(0, 0, 4, None, first)], fold(first))
    await world.store.write([a_slice(0, 5, 9, 5, second)], fold(second))
    [(next_offset, ids)] = (await world.store.positions([(TOPIC, 0)], 10)).values()
    assert (next_offset, list(ids)) == (10, [first[0].event_id, second[0].event_id])


async def the_recent_ids_are_the_latest_window_of_them_oldest_first(world: IngestWorld) -> None:
    batches: list[list[Event]] = [[request(), request()], [request(), request(), request()], [request()]]
    offset, expected = 0, None
    for events in batches:
        await world.store.write(
            [a_slice(0, offset, offset + len(events) - 1, expected, events)], fold(events)
        )
        offset = expected = offset + len(events)
    every = [event.event_id for events in batches for event in events]
    for window in (1, 2, 4, 6, 50):
        [(next_offset, ids)] = (await world.store.positions([(TOPIC, 0)], window)).values()
        assert (next_offset, list(ids)) == (6, every[-window:]), f"window {window}"


async def rejected_names_the_events_the_store_refuses_and_writes_nothing(world: IngestWorld) -> None:
    # jsonb holds no NUL: a payload with one cannot be catalogued.
    events: list[Event] = [request(7), request(8, prompt="a\x00b"), request(9), request(10, prompt="\x00")]
    with pytest.raises(asyncpg.DataError):
        await world.store.write([a_slice(0, 0, 3, None, events)], fold(events))
    assert await world.store.rejected(fold, events) == [1, 3]
    assert await world.store.rejected(fold, [events[0], events[2]]) == []
    assert await world.store.positions([(TOPIC, 0)], 10) == {}
    assert await counted(world) == []


async def counts_from_two_batches_add(world: IngestWorld) -> None:
    later = AT + timedelta(seconds=BUCKET_SECONDS)
    first: list[Event] = [request(), request(), request(8)]
    second: list[Event] = [request(), request(at=later)]
    await world.store.write([a_slice(0, 0, 2, None, first)], fold(first))
    await world.store.write([a_slice(0, 3, 4, 3, second)], fold(second))
    assert await counted(world) == [(7, BUCKET, 3), (7, BUCKET + 1, 1), (8, BUCKET, 1)]


BEHAVIOURS: dict[str, Callable[[IngestWorld], Awaitable[None]]] = {
    behaviour.__name__: behaviour
    for behaviour in (
        a_written_batchs_position_and_ids_are_returned,
        a_partition_never_counted_is_absent,
        a_slice_expecting_a_stale_position_is_fenced_and_writes_nothing,
        a_slice_expecting_the_stored_position_moves_it,
        the_recent_ids_are_the_latest_window_of_them_oldest_first,
        rejected_names_the_events_the_store_refuses_and_writes_nothing,
        counts_from_two_batches_add,
    )
}
