"""The semantic threshold chosen on labelled pairs: the lowest observed similarity whose precision reaches
the target, ties matched together, and a setting that matches the same pairs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmplane.services.gateway.similarity_calibration import (
    Counts,
    KindRow,
    ScoredPair,
    by_kind,
    calibrate,
    counts_at,
    shortest_between,
)

similarities = st.floats(min_value=-1.0, max_value=1.0, allow_nan=False).map(lambda value: round(value, 3))
scored_sets = st.lists(st.builds(ScoredPair, similarities, st.booleans()), min_size=1, max_size=60)
targets = st.floats(min_value=0.01, max_value=1.0)


def pairs(*rows: tuple[float, bool]) -> list[ScoredPair]:
    return [ScoredPair(similarity, same) for similarity, same in rows]


def test_the_lowest_threshold_at_the_target_is_chosen_though_a_higher_one_falls_short() -> None:
    scored = pairs((0.99, True), (0.97, False), (0.95, True), (0.93, True), (0.91, True), (0.5, False))
    # precision from the top: 1/1, 1/2, 2/3, 3/4, 4/5, 4/6
    chosen = calibrate(scored, 0.8)
    assert chosen is not None
    assert (chosen.threshold, chosen.counts) == (0.91, Counts(4, 1, 0, 1))
    assert (chosen.counts.precision, chosen.counts.recall) == (0.8, 1.0)
    assert calibrate(scored, 1.0) is not None and calibrate(scored, 1.0).threshold == 0.99  # type: ignore[union-attr]


def test_tied_similarities_are_matched_or_missed_together() -> None:
    # At 0.9 the tie holds one right and one wrong pair: 2 of 3 (0.67), never the 2 of 2 above it.
    scored = pairs((0.95, True), (0.9, True), (0.9, False), (0.8, False))
    chosen = calibrate(scored, 0.7)
    assert chosen is not None and chosen.threshold == 0.95
    assert counts_at(scored, 0.9) == Counts(2, 1, 0, 1)


def test_no_threshold_reaching_the_target_is_none() -> None:
    assert calibrate(pairs((0.9, False), (0.8, True), (0.7, False)), 0.6) is None
    assert calibrate(pairs((0.9, False)), 0.5) is None  # no pair shares an answer
    assert calibrate([], 0.5) is None


@pytest.mark.parametrize("target", [0.0, -0.5, 1.01])
def test_a_target_outside_0_to_1_is_refused(target: float) -> None:
    with pytest.raises(ValueError, match="target precision"):
        calibrate(pairs((0.9, True)), target)


def test_the_setting_is_the_shortest_decimal_that_matches_the_same_pairs() -> None:
    assert shortest_between(0.7, 0.8123) == 0.8
    assert shortest_between(0.81, 0.8123) == 0.812
    assert shortest_between(0.8122, 0.8123) == 0.8123
    assert shortest_between(float("-inf"), 0.29) == 0.2
    chosen = calibrate(pairs((0.9734, True), (0.97, False)), 0.9)
    assert chosen is not None and chosen.setting == 0.973


def test_each_kind_counts_its_matches_and_wrong_matches() -> None:
    scored = [
        ScoredPair(0.95, True, "surface"),
        ScoredPair(0.7, True, "paraphrase"),
        ScoredPair(0.92, True, "paraphrase"),
        ScoredPair(0.91, False, "near_miss"),
        ScoredPair(0.85, False, "near_miss"),
        ScoredPair(0.1, False, "unrelated"),
    ]
    rows = by_kind(scored, 0.9)
    assert rows == [
        KindRow("surface", 1, 1, 1, 0),
        KindRow("paraphrase", 2, 2, 1, 0),
        KindRow("near_miss", 2, 0, 0, 1),
        KindRow("unrelated", 1, 0, 0, 0),
    ]
    assert rows[1].missed == 1


def _precision_at(scored: list[ScoredPair], threshold: float) -> float | None:
    matched = [pair.same for pair in scored if pair.similarity >= threshold]
    return sum(matched) / len(matched) if matched else None


@given(scored_sets, targets)
def test_the_chosen_threshold_reaches_the_target_and_no_lower_observed_one_does(
    scored: list[ScoredPair], target: float
) -> None:
    chosen = calibrate(scored, target)
    qualifying = [
        pair.similarity
        for pair in scored
        if (precision := _precision_at(scored, pair.similarity)) is not None and precision >= target
    ]
    if chosen is None:
        assert not qualifying
        return
    assert chosen.threshold == min(qualifying)
    assert chosen.counts == counts_at(scored, chosen.threshold)
    assert chosen.counts.precision >= target
    assert counts_at(scored, chosen.setting) == chosen.counts


@given(scored_sets, targets, targets)
def test_raising_the_target_never_lowers_the_threshold(
    scored: list[ScoredPair], first: float, second: float
) -> None:
    low, high = calibrate(scored, min(first, second)), calibrate(scored, max(first, second))
    if high is not None:
        assert low is not None
        assert high.threshold >= low.threshold
        assert high.counts.recall <= low.counts.recall
