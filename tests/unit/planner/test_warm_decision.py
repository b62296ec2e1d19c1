"""Knowing when not to warm: a plan is issued whole or empty with one line saying why."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmplane.services.planner.policy import ChosenPrefix
from warmplane.services.planner.policy.warm_decision import (
    EmptyReason,
    WarmThresholds,
    decide_warm,
    expected_saved_tokens,
)

THRESHOLDS = WarmThresholds(
    min_expected_saved_tokens=256,
    readiness_budget_s=120.0,
    prefill_tokens_per_s=None,
    min_reuse_probability=0.05,
)
items = st.lists(
    st.builds(
        ChosenPrefix,
        prefix_id=st.integers(0, 2**62),
        depth=st.integers(0, 10),
        tokens=st.integers(1, 10_000),
        cost_tokens=st.integers(1, 10_000),
        reuse_probability=st.floats(0.0, 1.0),
    ),
    max_size=20,
)


@given(items, st.integers(0, 100_000), st.one_of(st.none(), st.floats(1.0, 1e5)))
def test_a_plan_is_whole_or_empty_with_a_reason_naming_the_model(
    chosen: list[ChosenPrefix], floor: int, rate: float | None
) -> None:
    thresholds = WarmThresholds(floor, 60.0, rate, 0.05)
    decision = decide_warm("m-1", chosen, thresholds)
    assert decision.items in (chosen, [])
    assert (decision.reason is None) == bool(decision.items)
    if decision.reason is not None:
        assert decision.message is not None and decision.message.startswith(
            "warming buys little for model m-1: "
        )
        assert "\n" not in decision.message
    else:  # issued: it saves enough and fits the readiness budget
        assert expected_saved_tokens(chosen) >= floor
        assert rate is None or sum(item.cost_tokens for item in chosen) / rate <= 60.0


def test_nothing_likely_enough() -> None:
    decision = decide_warm("m", [], THRESHOLDS)
    assert decision.reason is EmptyReason.NOTHING_LIKELY
    assert decision.message == "warming buys little for model m: no prefix is at least 5% likely to be reused"


def test_little_saved() -> None:
    chosen = [ChosenPrefix(1, 0, 1000, 1000, 0.2)]  # 200 expected
    decision = decide_warm("m", chosen, THRESHOLDS)
    assert decision.reason is EmptyReason.LITTLE_SAVED
    assert decision.message == (
        "warming buys little for model m: expected saved prefill 200 tokens (of 1,000 warmed) is below 256"
    )
    assert decide_warm("m", [*chosen, ChosenPrefix(2, 1, 1100, 100, 0.6)], THRESHOLDS).items  # 260 expected


def test_past_the_readiness_budget() -> None:
    chosen = [ChosenPrefix(1, 0, 50_000, 50_000, 0.9)]
    slow = WarmThresholds(256, 120.0, 100.0, 0.05)
    decision = decide_warm("m", chosen, slow)
    assert decision.reason is EmptyReason.PAST_READINESS_BUDGET
    assert decision.message == (
        "warming buys little for model m: warming 50,000 tokens would take 500 s, past the readiness budget"
        " of 120 s"
    )
    assert decide_warm("m", chosen, WarmThresholds(256, 120.0, 1000.0, 0.05)).items == chosen
