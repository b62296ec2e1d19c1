"""The spend frontier: the planner's policy swept over its one spend knob, beside the ceiling's curve and the
baselines' points, and how well the planner's probabilities match what the newcomer then used.

The knob is the least reuse probability (`PolicyKnobs.min_reuse_probability`): with calibrated probabilities
it is the least expected saving per warmed token a block must promise, so lowering it spends more for
less per token. Each setting of `SWEEP` is one warm set and one simulated newcomer. The ceiling's curve is
the ceiling's warm set (every block seen before the join that the newcomer uses in its first 5 minutes, in
order of first use) cut at each of the sweep's spends and at its own full spend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from warmplane.services.planner.policy import (
    ReliabilityRow,
    calibration_gap,
    candidate_probabilities,
    reliability,
)
from warmplane.services.planner.trace_eval.fleet_sim import Request, Served, serve
from warmplane.services.planner.trace_eval.policies import NEW, Setup, WarmBlocks, warm_cache, warmplane_at

SWEEP = (
    0.9,
    0.7,
    0.5,
    0.4,
    0.3,
    0.25,
    0.2,
    0.15,
    0.1,
    0.07,
    0.05,
    0.03,
    0.02,
    0.01,
    0.005,
    0.002,
    0.001,
    0.0,
)
"""The least reuse probabilities swept, most selective first."""


@dataclass(frozen=True, slots=True)
class Point:
    """One warm set's spend and the newcomer's hit ratios in its first minute and first 5 minutes."""

    label: str
    tokens: int
    hit_1m: float
    hit_5m: float


def simulate(
    blocks: WarmBlocks, newcomer: Sequence[Request], capacity_blocks: int, join_t: float, label: str
) -> Point:
    """The newcomer's figures over its first 5 minutes, warmed with `blocks`."""
    cache, spent = warm_cache(capacity_blocks, blocks)
    served = [serve(cache, request, NEW) for request in newcomer if request.t < join_t + 300]
    return Point(label, spent, _ratio(served, join_t + 60), _ratio(served, join_t + 300))


def sweep(setup: Setup, newcomer: Sequence[Request]) -> list[Point]:
    """The planner's policy at each knob of `SWEEP`, labelled by it."""
    capacity = setup.params.capacity_blocks
    return [
        simulate(warmplane_at(setup, knob), newcomer, capacity, setup.join_t, f"{knob:g}") for knob in SWEEP
    ]


def ceiling_curve(
    ceiling: WarmBlocks, spends: Sequence[int], newcomer: Sequence[Request], setup: Setup
) -> list[Point]:
    """The ceiling's warm set cut at each of `spends` (tokens, ancestors kept: the set is in order of
    first use) and whole."""
    points = []
    for spend in sorted({*(s for s in spends if s < _total(ceiling)), _total(ceiling)}):
        cut, used = [], 0
        for block, tokens in ceiling:
            if used + tokens > spend:
                break
            cut.append((block, tokens))
            used += tokens
        points.append(
            simulate(cut, newcomer, setup.params.capacity_blocks, setup.join_t, f"ceiling at {spend:,}")
        )
    return points


def beaten_by(frontier: Sequence[Point], tokens: int, hit_1m: float) -> bool:
    """Whether some point of `frontier` spends at most `tokens` and hits at least `hit_1m` in the first
    minute: a baseline at (`tokens`, `hit_1m`) is then dominated."""
    return any(point.tokens <= tokens and point.hit_1m >= hit_1m for point in frontier)


def reliability_rows(setup: Setup, newcomer: Sequence[Request]) -> tuple[list[ReliabilityRow], float]:
    """The planner's calibrated probability of each of the newcomer's candidates (its share of the trie at
    the join) against whether the newcomer used it in the ramp window, binned in tenths; and the gap
    weighted by blocks (`calibration_gap`)."""
    view = setup.planner
    window = view.knobs.ramp_window_s
    probabilities = candidate_probabilities(
        view.trie,
        setup.join_t,
        ring=setup.after,
        routing_depth=setup.routing_depth,
        replicas=[NEW],
        ramp_window_s=window,
        calibration=view.calibration,
    )[NEW]
    used = {block for request in newcomer if request.t < setup.join_t + window for block in request.chain}
    rows = reliability([(p, prefix in used) for prefix, p in probabilities.items()])
    return rows, calibration_gap(rows)


def _ratio(served: Sequence[Served], end: float) -> float:
    window = [s for s in served if s.t < end]
    blocks = sum(s.blocks for s in window)
    return sum(s.hit_blocks for s in window) / blocks if blocks else 0.0


def _total(blocks: WarmBlocks) -> int:
    return sum(tokens for _, tokens in blocks)
