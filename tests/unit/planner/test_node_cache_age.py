"""The node cache forgets what it remembered once its oldest node is `max_age_s` old, and the writer asks it
to before every fold, so no fold trusts a node whose chain row the retention sweep may have deleted."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.planner.ingestor_fakes import Consumer, request_record, started_ingestor
from tests.unit.planner.memory_ingest import MemoryIngest
from warmplane.services.planner.core.ingest_batch import Scope, ScopedPrefix
from warmplane.services.planner.core.node_cache import NodeCache
from warmplane.shared.chain_nodes import parent_of

SCOPE = ("acme", "m", "")


def nodes(*numbers: int) -> dict[Scope, list[int]]:
    return {SCOPE: list(numbers)}


def held(*numbers: int) -> set[ScopedPrefix]:
    return {(SCOPE, n) for n in numbers}


def test_the_cache_forgets_everything_once_its_oldest_node_is_older_than_the_bound() -> None:
    cache = NodeCache(max_age_s=3600)
    cache.add_all(nodes(1, 2), now=100.0)
    cache.add_all(nodes(3), now=3000.0)
    cache.forget_expired(3700.0)  # the oldest exactly 3600 s old: still trusted
    assert set(cache) == held(1, 2, 3)
    cache.forget_expired(3700.5)  # the younger node goes with the oldest: emptied whole
    assert len(cache) == 0


def test_the_age_counts_from_the_first_node_remembered_after_the_cache_was_emptied() -> None:
    cache = NodeCache(max_age_s=10)
    cache.add_all(nodes(1), now=0.0)
    cache.add_all(nodes(2), now=15.0)  # the old contents go before the new are remembered
    assert set(cache) == held(2)
    cache.forget_expired(25.0)
    assert set(cache) == held(2)
    cache.forget_expired(25.5)
    assert len(cache) == 0


def test_an_empty_batch_starts_no_clock() -> None:
    cache = NodeCache(max_age_s=10)
    cache.add_all({}, now=0.0)
    cache.add_all(nodes(1), now=8.0)
    cache.forget_expired(17.0)
    assert set(cache) == held(1)


def test_overflow_restarts_the_clock() -> None:
    cache = NodeCache(capacity=2, max_age_s=10)
    cache.add_all(nodes(1, 2), now=0.0)
    cache.add_all(nodes(3), now=9.0)  # overflows: emptied
    cache.add_all(nodes(4), now=12.0)
    cache.forget_expired(21.0)
    assert set(cache) == held(4)


def test_the_cache_refuses_an_age_bound_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="max_age_s"):
        NodeCache(max_age_s=0)


@pytest.mark.parametrize(("waited_s", "anchor", "ids"), [(3600.0, 2, [3]), (3601.0, None, [1, 2, 3])])
async def test_the_writer_folds_a_batch_trusting_only_nodes_younger_than_the_bound(
    waited_s: float, anchor: int | None, ids: list[int]
) -> None:
    clock = [1000.0]
    store = MemoryIngest()
    ingestor = started_ingestor(store, node_cache=NodeCache(max_age_s=3600), clock=lambda: clock[0])
    try:
        await ingestor.submit([request_record(0, [1, 2])], Consumer())
        await asyncio.wait_for(ingestor.flush(), 5)
        clock[0] += waited_s
        await ingestor.submit([request_record(1, [1, 2, 3])], Consumer())
        await asyncio.wait_for(ingestor.flush(), 5)
    finally:
        await asyncio.wait_for(ingestor.drain(), 5)
    nodes = store.batches[-1].chains[SCOPE]
    assert (parent_of(nodes.ids[0], nodes.parents[0]), list(nodes.ids)) == (anchor, ids)
