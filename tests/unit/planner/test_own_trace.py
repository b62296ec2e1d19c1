"""Request events as a Mooncake trace: blocks laid over chain tokens as vLLM lays them, ids that requests
share exactly when they share the tokens before a block's end, arrival order kept."""

from __future__ import annotations

import math
import zlib
from datetime import UTC, datetime, timedelta
from random import Random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmplane.services.devstack.job import DEFAULT_TRACE
from warmplane.services.planner.trace_eval.fleet_sim import requests_from_trace
from warmplane.services.planner.trace_eval.own_trace import (
    PartialBlocks,
    TrafficFilter,
    canonical_tokens,
    chain_blocks,
    derived_block_id,
    select,
    to_trace,
)
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, RequestObserved
from warmplane.shared.mooncake_trace import TraceRequest, read_trace, request_event
from warmplane.shared.prefix_chain import Namespace, chain_from_segments

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
NS = Namespace("acme", "m-1")


def event(
    chain: list[int],
    tokens: list[int],
    *,
    at_ms: int = 0,
    tenant: str = "acme",
    model: str = "m-1",
    prompt_tokens: int | None = None,
) -> RequestObserved:
    return RequestObserved(
        event_id=new_event_id(),
        occurred_at=T0 + timedelta(milliseconds=at_ms),
        producer="test",
        tenant=tenant,
        model=ModelRef(model),
        replica="r0",
        chain=chain,
        chain_tokens=tokens,
        prompt_tokens=prompt_tokens if prompt_tokens is not None else tokens[-1],
    )


# A conversation tree: each request is a path of choices from a small stock at every depth, so requests
# share prefixes often and diverge at random depths. A segment's size is a function of the path up to it,
# as a real prompt's tokens are, and spans zero to more than a 512-token block.
paths = st.lists(st.integers(0, 2), min_size=1, max_size=6)
block_sizes = st.sampled_from([1, 4, 16, 512])


def chained(path: list[int]) -> tuple[list[int], list[int]]:
    """Chain ids and cumulative tokens of a path of choices."""
    segments = [f"{path[: depth + 1]}".encode() for depth in range(len(path))]
    sizes = [zlib.crc32(segment) % 701 for segment in segments]
    chain = chain_from_segments(NS, segments, sizes)
    return list(chain.ids), list(chain.tokens)


@given(st.lists(paths, min_size=2, max_size=8), block_sizes, st.sampled_from(["drop", "keep"]))
def test_requests_share_the_ids_of_every_block_that_ends_inside_their_shared_prefix(
    requests: list[list[int]], block: int, partial: PartialBlocks
) -> None:
    chains = [chained(path) for path in requests]
    for chain_a, tokens_a in chains:
        blocks_a = chain_blocks(chain_a, tokens_a, block, partial)
        for chain_b, tokens_b in chains:
            blocks_b = chain_blocks(chain_b, tokens_b, block, partial)
            shared = 0
            while shared < min(len(chain_a), len(chain_b)) and chain_a[shared] == chain_b[shared]:
                shared += 1
            full = tokens_a[shared - 1] // block if shared else 0
            assert blocks_a[:full] == blocks_b[:full]
            # ...and no block beyond it: a block ending past the shared segments covers tokens that differ.
            assert not set(blocks_a[full + 1 :]) & set(blocks_b) or chain_a == chain_b


@given(paths, block_sizes)
def test_block_counts_follow_the_tokens_full_blocks_only_unless_partial_ones_are_kept(
    path: list[int], block: int
) -> None:
    chain, tokens = chained(path)
    assert len(chain_blocks(chain, tokens, block, "drop")) == tokens[-1] // block
    assert len(chain_blocks(chain, tokens, block, "keep")) == math.ceil(tokens[-1] / block)


@given(paths, block_sizes)
def test_a_trace_record_reads_back_as_the_blocks_the_mapping_laid(path: list[int], block: int) -> None:
    chain, tokens = chained(path)
    partials: tuple[PartialBlocks, ...] = ("drop", "keep")
    for partial in partials:
        trace = to_trace([event(chain, tokens)], block, partial)
        cut = tokens[-1] if partial == "keep" else tokens[-1] // block * block
        assert trace.blockless == (cut == 0) and len(trace.records) == (cut > 0)
        if not trace.records:
            continue
        (request,) = requests_from_trace(trace.records, block, block)
        assert request.cumulative[-1] == cut and trace.records[0].input_length == tokens[-1]
        assert all(own == block for own in request.own_tokens[:-1]) and 0 < request.own_tokens[-1] <= block


def test_a_chain_cut_every_block_maps_to_its_own_ids_as_a_replayed_mooncake_trace_is() -> None:
    record = TraceRequest(timestamp=0, input_length=1300, output_length=7, hash_ids=[5, 9, 11])
    replayed = request_event(record, start=T0, tenant="acme", model=ModelRef("m-1"), replica="r0")
    assert replayed.chain_tokens == [512, 1024, 1300]
    assert chain_blocks(replayed.chain, replayed.chain_tokens, 512, "keep") == [5, 9, 11]
    assert chain_blocks(replayed.chain, replayed.chain_tokens, 512, "drop") == [5, 9]


def test_blocks_straddle_segments_and_take_the_id_of_the_segment_holding_their_last_token() -> None:
    # Segments of 20, 20 and 10 tokens; blocks of 16 end at tokens 16, 32 and 48 (and 50, partial).
    blocks = chain_blocks([10, 11, 12], [20, 40, 50], 16, "keep")
    assert blocks == [10, 11, 12, derived_block_id(12, 1)]
    # Two blocks end inside one long segment: the first takes its id, the second a derived one.
    assert chain_blocks([10, 11], [8, 40], 16, "drop") == [11, derived_block_id(11, 1)]
    assert derived_block_id(11, 1) not in {10, 11, 12} and derived_block_id(11, 1) != derived_block_id(12, 1)


def test_a_segment_is_counted_as_first_seen_so_scaled_estimates_do_not_shift_shared_blocks() -> None:
    # The gateway scales a chain's estimates to each request's prompt: the shared root reads 100 tokens
    # in one request and 103 in the next, which would move its block boundary.
    first = event([1, 2], [100, 220])
    second = event([1, 3], [103, 310], at_ms=5)
    assert canonical_tokens([first, second]) == [(100, 220), (100, 307)]
    trace = to_trace([first, second], 16)
    shared = 100 // 16
    assert trace.records[0].hash_ids[:shared] == trace.records[1].hash_ids[:shared]
    assert trace.records[1].input_length == 307


def test_selection_keeps_one_tenant_model_and_window_in_arrival_order() -> None:
    events = [
        event([1], [32], at_ms=300),
        event([2], [32], at_ms=100),
        event([3], [32], at_ms=100, tenant="other"),
        event([4], [32], at_ms=200, model="m-2"),
        event([5], [32], at_ms=900),
        event([6], [32], at_ms=100),
    ]
    window = TrafficFilter(
        "acme", "m-1", since=T0 + timedelta(milliseconds=100), until=T0 + timedelta(seconds=0.9)
    )
    assert [e.chain[0] for e in select(events, window)] == [2, 6, 1]
    trace = to_trace(select(events, window), 16)
    assert [r.timestamp for r in trace.records] == [0, 0, 200]
    assert [r.hash_ids for r in trace.records] == [
        [2, derived_block_id(2, 1)],
        [6, derived_block_id(6, 1)],
        [1, derived_block_id(1, 1)],
    ]
    assert trace.start == T0 + timedelta(milliseconds=100)


def test_requests_shorter_than_a_block_are_left_out_and_counted_unless_partial_blocks_are_kept() -> None:
    events = [event([1], [10]), event([2], [40], at_ms=1)]
    dropped = to_trace(events, 16, "drop")
    assert [r.hash_ids for r in dropped.records] == [[2, derived_block_id(2, 1)]] and dropped.blockless == 1
    assert dropped.sources == [events[1]] and dropped.records[0].timestamp == 1
    kept = to_trace(events, 16, "keep")
    assert len(kept.records) == 2 and kept.blockless == 0


def test_a_block_size_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="block_tokens"):
        chain_blocks([1], [10], 0)


@given(st.lists(st.integers(0, 5_000), min_size=1, max_size=30), st.randoms(use_true_random=False))
def test_records_come_in_arrival_order_equal_times_in_the_order_given(times: list[int], rng: Random) -> None:
    events = [event([index + 1], [40], at_ms=at) for index, at in enumerate(times)]
    rng.shuffle(events)
    trace = to_trace(select(events, TrafficFilter("acme", "m-1")), 16)
    expected = sorted(events, key=lambda e: e.occurred_at)  # stable: ties keep the shuffled order
    assert trace.sources == expected
    assert [r.timestamp for r in trace.records] == [at - min(times) for at in sorted(times)]
    assert [r.hash_ids[0] for r in trace.records] == [e.chain[0] for e in expected]


def test_a_replayed_mooncake_slice_exports_back_to_the_same_records() -> None:
    records = list(read_trace(DEFAULT_TRACE, 400))
    events = [
        request_event(record, start=T0, tenant="acme", model=ModelRef("m-1"), replica="r0")
        for record in records
    ]
    trace = to_trace(select(events, TrafficFilter("acme", "m-1")), 512, "keep")
    assert trace.records == [
        TraceRequest(r.timestamp - records[0].timestamp, r.input_length, 0, r.hash_ids) for r in records
    ]
    assert requests_from_trace(trace.records, 512, 512) == requests_from_trace(records, 512)
