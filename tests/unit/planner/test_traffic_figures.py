"""What the events say before any simulation: the cold-start penalty, reuse, exact repeats."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmplane.services.planner.trace_eval.traffic_figures import (
    ShareRow,
    cold_start_penalty,
    exact_repeats,
    nearest_rank,
    seen_before,
    share_rows,
    traffic_figures,
)
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, RequestObserved

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def request(
    chain: list[int],
    *,
    at_s: float = 0.0,
    tokens: list[int] | None = None,
    prompt: int | None = None,
    cached: int = 0,
    ttft_ms: float | None = None,
) -> RequestObserved:
    cumulative = tokens or [100 * (i + 1) for i in range(len(chain))]
    return RequestObserved(
        event_id=new_event_id(),
        occurred_at=T0 + timedelta(seconds=at_s),
        producer="test",
        tenant="acme",
        model=ModelRef("m-1"),
        replica="r0",
        chain=chain,
        chain_tokens=cumulative,
        prompt_tokens=prompt if prompt is not None else cumulative[-1],
        cached_tokens=cached,
        ttft_ms=ttft_ms,
    )


def test_nearest_rank_takes_the_ceiling_rank() -> None:
    assert nearest_rank([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0
    assert nearest_rank([5.0, 1.0, 4.0, 2.0, 3.0], 0.5) == 3.0
    assert nearest_rank(list(map(float, range(1, 11))), 0.9) == 9.0
    assert nearest_rank([7.0], 0.9) == 7.0
    with pytest.raises(ValueError, match="nearest_rank"):
        nearest_rank([], 0.5)


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=50), st.floats(0.01, 1.0))
def test_nearest_rank_is_a_member_with_at_least_q_of_the_values_at_or_below_it(
    values: list[float], q: float
) -> None:
    value = nearest_rank(values, q)
    assert value in values
    assert sum(v <= value for v in values) >= q * len(values)


def test_the_penalty_compares_requests_without_cached_tokens_to_those_with_some() -> None:
    requests = [
        request([1], cached=0, ttft_ms=400.0, prompt=900),
        request([2], cached=0, ttft_ms=600.0, prompt=1100),
        request([3], cached=0, ttft_ms=900.0, prompt=1000),
        request([4], cached=64, ttft_ms=100.0, prompt=1000),
        request([5], cached=512, ttft_ms=200.0, prompt=1200),
        request([6], cached=512, prompt=600, ttft_ms=None),
        request([7], cached=0, ttft_ms=None),
    ]
    penalty = cold_start_penalty(requests)
    assert (penalty.cold.requests, penalty.cold.median_ms, penalty.cold.p90_ms) == (3, 600.0, 900.0)
    assert penalty.cold.median_prompt_tokens == 1000.0
    assert (penalty.warm.requests, penalty.warm.median_ms, penalty.warm.p90_ms) == (2, 100.0, 200.0)
    assert penalty.without_ttft == 2
    assert penalty.median_ratio == 6.0 and penalty.p90_ratio == 4.5


def test_without_any_ttft_there_is_no_ratio() -> None:
    penalty = cold_start_penalty([request([1]), request([2], cached=50, prompt=100)])
    assert penalty.cold.requests == penalty.warm.requests == 0 and penalty.without_ttft == 2
    assert penalty.median_ratio is None and penalty.cold.median_ms is None


def test_reuse_rows_count_prefixes_by_how_many_requests_each_carries() -> None:
    per_root = Counter({1: 1, 2: 1, 3: 5, 4: 12, 5: 181})
    assert share_rows(per_root) == [
        ShareRow(1, 1, 2, 2 / 200),
        ShareRow(2, 9, 1, 5 / 200),
        ShareRow(10, 99, 1, 12 / 200),
        ShareRow(100, None, 1, 181 / 200),
    ]


def test_a_prefix_counts_as_seen_only_within_the_window_before_the_request() -> None:
    requests = [
        request([1, 2], at_s=0),  # nothing before it
        request([1, 2, 3], at_s=30),  # [1, 2] seen 30 s ago: 200 of 300 tokens
        request([1, 9], at_s=200),  # [1] seen 170 s ago: within 5 min, not 1 min
        request([7], at_s=4000),  # new root
        request([1, 2, 3], at_s=4100),  # last seen 3,900 s ago: beyond every window
    ]
    one, five, hour = seen_before(requests, (60.0, 300.0, 3600.0))
    assert one.request_share == pytest.approx(1 / 5) and one.token_share == pytest.approx(200 / 1100)
    assert five.request_share == pytest.approx(2 / 5)
    assert five.token_share == pytest.approx((200 + 100) / 1100)
    assert hour.request_share == pytest.approx(2 / 5) and hour.token_share == five.token_share


def test_exact_repeats_need_the_same_whole_chain_and_prompt_size() -> None:
    requests = [
        request([1, 2], prompt=210),
        request([1, 2], prompt=210),  # a repeat
        request([1, 2], prompt=230),  # same chain, another prompt size (a longer generation prompt)
        request([1], prompt=210),  # a prefix of it
        request([1, 2], prompt=210),  # a repeat again
    ]
    assert exact_repeats(requests) == 2


def test_figures_of_no_requests_are_zeros() -> None:
    figures = traffic_figures([])
    assert figures.requests == 0 and figures.span_s == 0.0 and figures.exact_repeats == 0
    assert all(row.prefixes == 0 for row in figures.roots)
    assert all(s.request_share == 0.0 for s in figures.seen)
