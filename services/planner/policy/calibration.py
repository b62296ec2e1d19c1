"""Calibrated reuse probabilities: the map from the policy's score to the observed chance of reuse, fitted on
a model's own history. Pure: no I/O, no clock.

The score of a prefix is its expected uses in the ramp window, its decayed rate times the window (the
Poisson model's chance of at least one use, `warm_set.reuse_probability`, is 1 - exp(-score); the score
itself does not saturate, so popular prefixes stay ranked). The Poisson chance ranks prefixes well but
is not a probability: one request a minute ago gives a rate that predicts a use in the next five minutes
nearly surely, and on chat traffic most such prefixes are never used again. So the planner backtests
inside the history it holds: it scores every prefix on the counts up to `now - window` (the trie as it
was then), looks at which of them were used between then and `now`, and fits a non-decreasing map from
score to that outcome by isotonic regression (pool adjacent violators, each prefix one sample),
interpolated between the pooled blocks' mean scores, linearly in the score's logarithm. The map is per
model (the counts handed in are one model's) and refreshed with each read of the counts.

A history with fewer than `min_samples` scored prefixes says too little: the map is then `PRIOR`, the
Poisson chance divided by `PRIOR_DIVISOR` (documented with it). Either way the map is non-decreasing and its
values lie in [0, 1], so a parent (never scored below its child) is never less likely than its child.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

PRIOR_DIVISOR = 4.0
"""The prior's shrinkage: with too little history, a score s means (1 - exp(-s)) / 4. Issue 4's
measurement on the conversation trace found the raw scores 2 to 10 times too high (of blocks scored 0.3
to 0.4, 2.8% were used in the next 5 minutes; of 0.7 to 0.9, 22%); 4 is inside that range and keeps a
fresh model's plans small, which costs little: the first plan after enough history is calibrated."""
MIN_SAMPLES = 200
"""Fewer scored prefixes than this in the backtest, and the prior is used."""


@dataclass(frozen=True, slots=True)
class ReuseCalibration:
    """A non-decreasing map from score (expected uses in the ramp window) to probability of reuse in it.

    Fitted: `scores` (increasing, positive) are the pooled blocks' mean scores and `probabilities`
    (non-decreasing, in [0, 1]) their shares reused; between two the map is linear in the score's
    logarithm (rates span orders of magnitude, and a prefix above the routing depth is scored at its
    replica's share of the rate, which may fall in a gap between the fleet's blocks), outside them flat.
    Not fitted (`PRIOR`): the Poisson chance over `PRIOR_DIVISOR`. `samples`: the prefixes it was fitted
    on (or too few to fit).
    """

    scores: tuple[float, ...]
    probabilities: tuple[float, ...]
    fitted: bool
    samples: int

    def __call__(self, score: float) -> float:
        if not self.fitted:
            return -math.expm1(-max(0.0, score)) / PRIOR_DIVISOR
        right = bisect.bisect_left(self.scores, score)
        if right == len(self.scores):
            return self.probabilities[-1]
        if right == 0 or self.scores[right] == score:
            return self.probabilities[right]
        x0, x1 = math.log(self.scores[right - 1]), math.log(self.scores[right])
        y0, y1 = self.probabilities[right - 1], self.probabilities[right]
        # Clamped: rounding must not carry an interpolated value past its ends (out of [0, 1] at the top).
        return min(y1, max(y0, y0 + (y1 - y0) * (math.log(score) - x0) / (x1 - x0)))


PRIOR = ReuseCalibration((), (), fitted=False, samples=0)
"""The map when history is too short: the Poisson chance over `PRIOR_DIVISOR`."""


def fit_isotonic(samples: Iterable[tuple[float, bool]], min_samples: int = MIN_SAMPLES) -> ReuseCalibration:
    """The non-decreasing map from score to the share of samples reused, by pool adjacent violators over
    `(score, reused)` pairs (each pooled block at its mean score); `PRIOR` when there are fewer than
    `min_samples` positive scores. Scores that are not positive and finite (nothing to rank) are left
    out."""
    ordered = sorted((sample for sample in samples if 0 < sample[0] < math.inf), key=lambda sample: sample[0])
    if len(ordered) < max(min_samples, 1):
        return ReuseCalibration((), (), fitted=False, samples=len(ordered))
    # Each block: [sum of scores, reused, samples]; a new block merges into the last while it is not higher.
    blocks: list[list[float]] = []
    for score, reused in ordered:
        blocks.append([score, float(reused), 1.0])
        while len(blocks) > 1 and (
            blocks[-2][1] / blocks[-2][2] >= blocks[-1][1] / blocks[-1][2]
            or blocks[-2][0] / blocks[-2][2] == blocks[-1][0] / blocks[-1][2]
        ):
            total, hits, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += hits
            blocks[-1][2] += count
    return ReuseCalibration(
        tuple(block[0] / block[2] for block in blocks),
        tuple(block[1] / block[2] for block in blocks),
        fitted=True,
        samples=len(ordered),
    )


def reused_prefixes(parents: Mapping[int, int | None], leaves: Iterable[int]) -> set[int]:
    """Every prefix on the chains ending at `leaves` (`parents`: each prefix's parent, None at a root)."""
    reused: set[int] = set()
    for leaf in leaves:
        step: int | None = leaf
        while step is not None and step not in reused:
            reused.add(step)
            step = parents.get(step)
    return reused


@dataclass(frozen=True, slots=True)
class ReliabilityRow:
    """A bin of predicted probability, [low, high): its prefixes, their mean prediction, the share reused."""

    low: float
    high: float
    blocks: int
    predicted: float
    observed: float


def reliability(predictions: Sequence[tuple[float, bool]], bins: int = 10) -> list[ReliabilityRow]:
    """`(predicted, reused)` pairs binned by prediction into `bins` equal widths of [0, 1] (1.0 in the last);
    empty bins are left out."""
    grouped: dict[int, list[tuple[float, bool]]] = {}
    for predicted, reused in predictions:
        grouped.setdefault(min(int(predicted * bins), bins - 1), []).append((predicted, reused))
    return [
        ReliabilityRow(
            index / bins,
            (index + 1) / bins,
            len(rows),
            sum(p for p, _ in rows) / len(rows),
            sum(1 for _, r in rows if r) / len(rows),
        )
        for index, rows in sorted(grouped.items())
    ]


def calibration_gap(rows: Sequence[ReliabilityRow]) -> float:
    """The mean absolute gap between predicted and observed reuse over `rows`, weighted by their blocks."""
    blocks = sum(row.blocks for row in rows)
    return sum(row.blocks * abs(row.predicted - row.observed) for row in rows) / blocks if blocks else 0.0
