"""Choosing the semantic tier's similarity threshold from labelled pairs. Pure.

The cache answers a query from an earlier one when their similarity is at least the threshold
(`result_cache.py`), so at a threshold `t` a pair "matches" when its similarity is >= t. A match of a
pair whose answers differ serves a wrong answer (a false match); a pair with one answer below `t` is a
missed hit. Precision is the share of matches that are right, recall the share of same-answer pairs
matched.

`calibrate` takes the lowest threshold whose precision reaches the target. Recall only falls as the
threshold rises, so that is the threshold with the most hits at the target precision. Precision is not
monotone in the threshold: a higher one can fall short where a lower one reaches the target, and the
lowest qualifying one is still chosen. Candidates are the observed similarities: pairs of equal
similarity always fall on the same side of a threshold, so ties are matched or missed together.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal


@dataclass(frozen=True, slots=True)
class ScoredPair:
    """A labelled pair and the cosine similarity of its two queries' embeddings."""

    similarity: float
    same: bool
    kind: str = ""


@dataclass(frozen=True, slots=True)
class Counts:
    """The pairs at a threshold: matched and right, matched and wrong, missed, rightly kept apart."""

    true_matches: int
    false_matches: int
    missed: int
    true_rejects: int

    @property
    def precision(self) -> float:
        """Right matches over all matches; 1.0 when nothing matches (no wrong answer is served)."""
        matched = self.true_matches + self.false_matches
        return self.true_matches / matched if matched else 1.0

    @property
    def recall(self) -> float:
        """Same-answer pairs matched over all same-answer pairs; 0.0 when there are none."""
        same = self.true_matches + self.missed
        return self.true_matches / same if same else 0.0


@dataclass(frozen=True, slots=True)
class Calibration:
    """The chosen threshold (an observed similarity), the counts at it, and `setting`: the shortest
    decimal that matches exactly the same pairs (above the next lower observed similarity, at most
    `threshold`), the value to configure."""

    target: float
    threshold: float
    setting: float
    counts: Counts


@dataclass(frozen=True, slots=True)
class KindRow:
    """One kind of pair at a threshold: how many, how many share an answer, and how many match."""

    kind: str
    pairs: int
    same: int
    true_matches: int
    false_matches: int

    @property
    def missed(self) -> int:
        return self.same - self.true_matches


def counts_at(scored: Sequence[ScoredPair], threshold: float) -> Counts:
    """The pairs of `scored` at `threshold` (a pair matches when its similarity is >= `threshold`)."""
    tp = sum(1 for pair in scored if pair.same and pair.similarity >= threshold)
    fp = sum(1 for pair in scored if not pair.same and pair.similarity >= threshold)
    same = sum(1 for pair in scored if pair.same)
    return Counts(tp, fp, same - tp, len(scored) - same - fp)


def calibrate(scored: Sequence[ScoredPair], target: float) -> Calibration | None:
    """The lowest observed similarity at which precision is at least `target` (see the module), or None
    when no threshold reaches it (or no pair shares an answer). Raises `ValueError` unless
    0 < `target` <= 1.

    Precision is compared as a float: division and the target's decimal are both rounded to nearest,
    which keeps their order, so 19 right of 20 meets a target of 0.95."""
    if not 0 < target <= 1:
        raise ValueError(f"the target precision must be in (0, 1], not {target}")
    ordered = sorted(scored, key=lambda pair: pair.similarity, reverse=True)
    same_total = sum(1 for pair in ordered if pair.same)
    chosen: tuple[int, int, int] | None = None  # (index of the threshold's pair, right, wrong)
    right = wrong = 0
    for index, pair in enumerate(ordered):
        right += pair.same
        wrong += not pair.same
        last_of_tie = index + 1 == len(ordered) or ordered[index + 1].similarity < pair.similarity
        if last_of_tie and right / (right + wrong) >= target:
            chosen = (index, right, wrong)
    if chosen is None:
        return None
    index, right, wrong = chosen
    threshold = ordered[index].similarity
    below = ordered[index + 1].similarity if index + 1 < len(ordered) else -math.inf
    counts = Counts(right, wrong, same_total - right, len(ordered) - same_total - wrong)
    return Calibration(target, threshold, shortest_between(below, threshold), counts)


def shortest_between(below: float, threshold: float) -> float:
    """The decimal with the fewest digits after the point in (`below`, `threshold`], cut down from
    `threshold`: a setting that matches the same pairs as `threshold`. Requires `below` < `threshold`."""
    exact = Decimal(threshold)
    for digits in range(1, 18):
        value = float(exact.quantize(Decimal(1).scaleb(-digits), rounding=ROUND_FLOOR))
        if value > below:
            return value
    return threshold


def by_kind(scored: Sequence[ScoredPair], threshold: float) -> list[KindRow]:
    """One row per kind, in the order kinds first appear in `scored`, counted at `threshold`."""
    rows: dict[str, list[int]] = {}
    for pair in scored:
        row = rows.setdefault(pair.kind, [0, 0, 0, 0])
        matched = pair.similarity >= threshold
        row[0] += 1
        row[1] += pair.same
        row[2] += pair.same and matched
        row[3] += not pair.same and matched
    return [KindRow(kind, *counts) for kind, counts in rows.items()]
