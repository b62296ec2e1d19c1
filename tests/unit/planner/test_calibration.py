"""Calibrated reuse probabilities: the isotonic fit's properties, the prior, the backtest on a model's own
history, and the reliability figures."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmplane.services.planner.policy import (
    PRIOR,
    LeafCount,
    PolicyKnobs,
    ReliabilityRow,
    RingSpec,
    StoredPrefix,
    WarmBudget,
    calibration_gap,
    choose_for_replica,
    fit_calibration,
    fit_isotonic,
    reliability,
    trie_from_counts,
)
from warmplane.services.planner.policy.calibration import PRIOR_DIVISOR

KNOBS = PolicyKnobs(half_life_s=60, frequency_half_life_s=600, ramp_window_s=300)
samples = st.lists(
    st.tuples(st.floats(min_value=1e-6, max_value=1e4, allow_nan=False), st.booleans()),
    min_size=1,
    max_size=300,
)
scores = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)


@given(samples, st.lists(scores, min_size=2, max_size=20))
def test_a_fitted_map_is_monotone_and_a_probability(pairs: list[tuple[float, bool]], at: list[float]) -> None:
    fitted = fit_isotonic(pairs, min_samples=1)
    values = [fitted(score) for score in sorted(at)]
    assert all(0.0 <= value <= 1.0 for value in values)
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(values))


@given(samples, scores)
def test_a_history_all_reused_maps_to_one_and_none_reused_to_zero(
    pairs: list[tuple[float, bool]], score: float
) -> None:
    assert fit_isotonic([(s, True) for s, _ in pairs], min_samples=1)(score) == 1.0
    assert fit_isotonic([(s, False) for s, _ in pairs], min_samples=1)(score) == 0.0


@given(samples, scores)
def test_too_few_samples_fall_back_to_the_prior(pairs: list[tuple[float, bool]], score: float) -> None:
    fitted = fit_isotonic(pairs, min_samples=len(pairs) + 1)
    assert not fitted.fitted
    assert fitted(score) == PRIOR(score) == -math.expm1(-score) / PRIOR_DIVISOR


def test_a_score_that_always_came_true_maps_to_one_and_one_that_never_did_to_zero() -> None:
    fitted = fit_isotonic([(0.5, False)] * 100 + [(50.0, True)] * 100, min_samples=10)
    assert fitted(0.1) == 0.0 and fitted(0.5) == 0.0
    assert fitted(50.0) == 1.0 and fitted(500.0) == 1.0
    assert 0.0 < fitted(5.0) < 1.0  # between the two, by the score's logarithm
    assert math.isclose(fitted(5.0), 0.5)


def chain_prefixes(count: int) -> list[StoredPrefix]:
    """`count` chains of two prefixes each: root 10 * i, child 10 * i + 1."""
    return [
        prefix
        for i in range(1, count + 1)
        for prefix in (StoredPrefix(10 * i, None, 512), StoredPrefix(10 * i + 1, 10 * i, 1024))
    ]


def test_traffic_that_never_repeats_is_calibrated_to_no_reuse() -> None:
    """Every chain is used once, a minute apart: after the backtest nothing is likely to be reused, though
    the Poisson chance of a chain seen a minute ago is high."""
    prefixes = chain_prefixes(600)
    counts = [LeafCount(10 * i + 1, 60.0 * (i // 20), 1) for i in range(1, 601)]
    now = counts[-1].at_s + 30
    fitted = fit_calibration(prefixes, counts, now, KNOBS)
    assert fitted.fitted and fitted.samples >= 200
    assert fitted(5.0) == 0.0 and fitted(1e3) == 0.0


def test_traffic_that_repeats_is_calibrated_to_reuse() -> None:
    """Twenty chains used every minute for half an hour: each was used again in the backtest's window."""
    prefixes = chain_prefixes(200)
    hot = [LeafCount(10 * i + 1, 60.0 * minute + 30, 1) for i in range(1, 21) for minute in range(30)]
    cold = [LeafCount(10 * i + 1, 30.0, 1) for i in range(21, 201)]
    fitted = fit_calibration(prefixes, hot + cold, 1800.0, KNOBS)
    assert fitted.fitted
    assert fitted(10.0) == 1.0  # the hot chains' scores
    assert fitted(0.01) == 0.0  # the cold ones', decayed


def test_a_short_history_uses_the_prior() -> None:
    prefixes = chain_prefixes(10)
    counts = [LeafCount(10 * i + 1, 10.0 * i, 1) for i in range(1, 11)]
    fitted = fit_calibration(prefixes, counts, 1000.0, KNOBS)
    assert not fitted.fitted and fitted.samples == 20
    assert fitted(3.0) == PRIOR(3.0)


def test_reliability_bins_by_prediction_and_weighs_the_gap_by_blocks() -> None:
    pairs = [(0.05, False)] * 90 + [(0.05, True)] * 10 + [(0.95, True)] * 10
    rows = reliability(pairs)
    assert rows == [
        ReliabilityRow(0.0, 0.1, 100, pytest.approx(0.05), 0.1),  # type: ignore[arg-type]
        ReliabilityRow(0.9, 1.0, 10, pytest.approx(0.95), 1.0),  # type: ignore[arg-type]
    ]
    assert math.isclose(calibration_gap(rows), (100 * 0.05 + 10 * 0.05) / 110)
    assert calibration_gap([]) == 0.0
    assert reliability([(1.0, True)])[0].low == 0.9  # 1.0 falls in the last bin


def test_a_calibrated_choice_keeps_blocks_by_their_calibrated_probability() -> None:
    """The least reuse probability applies to the calibrated chance, and items carry it: 1's score (30
    requests) maps to 1.0, 2's (one request, Poisson 0.29) to 0, below the map's lowest block."""
    prefixes = [StoredPrefix(1, None, 100), StoredPrefix(2, None, 100)]
    counts = [LeafCount(1, 0.0, 30), LeafCount(2, 0.0, 1)]
    trie, _ = trie_from_counts(prefixes, counts, 0.0, 600.0)
    fitted = fit_isotonic([(0.5, False)] * 50 + [(10.0, True)] * 50, min_samples=10)
    common = {
        "replica": "r",
        "members": ["r"],
        "ring": RingSpec(),
        "budget": WarmBudget(tokens=1_000),
        "kv_capacity_tokens": None,
        "knobs": PolicyKnobs(half_life_s=600, frequency_half_life_s=None, min_reuse_probability=0.4),
    }
    raw, _ = choose_for_replica(trie, 0.0, **common)  # type: ignore[arg-type]
    calibrated, _ = choose_for_replica(trie, 0.0, calibration=fitted, **common)  # type: ignore[arg-type]
    assert [item.prefix_id for item in raw] == [1]  # 2: Poisson 0.29 < 0.4
    assert [item.prefix_id for item in calibrated] == [1]
    lenient = {
        **common,
        "knobs": PolicyKnobs(half_life_s=600, frequency_half_life_s=None, min_reuse_probability=0.2),
    }
    assert [i.prefix_id for i in choose_for_replica(trie, 0.0, **lenient)[0]] == [1, 2]  # type: ignore[arg-type]
    assert [i.prefix_id for i in choose_for_replica(trie, 0.0, calibration=fitted, **lenient)[0]] == [1]  # type: ignore[arg-type]
    [item] = calibrated
    assert item.reuse_probability == fitted(trie.rate(1, 0.0) * 300)
    assert fitted(trie.rate(2, 0.0) * 300) == 0.0
