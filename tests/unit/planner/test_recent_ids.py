"""The window of recent event ids: bounded, forgets the oldest first; the ledger's packing round trips."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmplane.services.planner.core.recent_ids import RecentIds, pack_ids, unpack_ids


@settings(max_examples=200)
@given(st.lists(st.integers(min_value=0, max_value=2**128 - 1), unique=True), st.integers(1, 50))
def test_the_window_holds_exactly_the_last_capacity_ids(ids: list[int], capacity: int) -> None:
    window = RecentIds(capacity)
    for event_id in ids:
        window.add(event_id)
    assert len(window) == min(capacity, len(ids))
    assert all(event_id in window for event_id in ids[-capacity:])
    assert not any(event_id in window for event_id in ids[:-capacity])


def test_extend_skips_ids_it_holds() -> None:
    window = RecentIds(2)
    window.extend([1, 2, 2, 1])
    assert (1 in window, 2 in window, len(window)) == (True, True, 2)


def test_a_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        RecentIds(0)


@given(st.lists(st.uuids()))
def test_packed_ids_unpack_to_the_same_ids_in_order(ids: list[uuid.UUID]) -> None:
    packed = pack_ids(event_id.int for event_id in ids)
    assert len(packed) == 16 * len(ids)
    assert unpack_ids(packed) == ids


def test_a_torn_ledger_row_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        unpack_ids(b"\x00" * 17)


@settings(max_examples=200)
@given(st.lists(st.lists(st.integers(0, 10**6), max_size=30), max_size=30), st.integers(1, 60))
def test_chunks_keep_at_least_the_last_capacity_ids_and_at_most_a_chunk_more(
    chunks: list[list[int]], capacity: int
) -> None:
    window, admitted, largest = RecentIds(capacity), [], 0
    for chunk in chunks:
        fresh = [i for i in dict.fromkeys(chunk) if i not in window]
        window.admit(fresh)
        admitted += fresh
        largest = max(largest, len(fresh))
        assert all(i in window for i in admitted[-capacity:])
        assert len(window) <= capacity + largest
