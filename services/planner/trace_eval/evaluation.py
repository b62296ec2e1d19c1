"""One trace through the simulated fleet: unwarmed for the established replicas, then the newcomer under
each policy, measured against the same newcomer unwarmed.

Per policy, for the new replica: the prefix hit ratio (cached blocks / prompt blocks) in its first minute,
first 5 minutes and everything after the join; requests with no cached block in the first 5 minutes;
prefill tokens spent warming; tokens saved (hit tokens beyond the unwarmed run's, same requests); yield =
saved / spent. `steady` is the unwarmed newcomer's hit ratio from 5 minutes after the join to the end.

`ceiling` is no policy: it knows the future. It warms every block seen before the join that the newcomer
will request in its first 5 minutes, in order of first use, within the token limit: the most a policy
that knows only the history could warm usefully, so its figures bound every policy's (eviction aside).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from warmplane.services.planner.policy import ReliabilityRow
from warmplane.services.planner.trace_eval.fleet_sim import (
    LruCache,
    Request,
    Served,
    auto_routing_depth,
    route,
    serve,
    with_routing_depth,
)
from warmplane.services.planner.trace_eval.frontier import Point, ceiling_curve, reliability_rows, sweep
from warmplane.services.planner.trace_eval.params import EvalParams
from warmplane.services.planner.trace_eval.policies import (
    NEW,
    POLICIES,
    Setup,
    WarmBlocks,
    planner_view,
    warm_cache,
    warmplane_decision,
)
from warmplane.shared.hash_ring import HashRing

_MAX_KEY_SHARE = 0.05
"""The automatic routing depth: the shallowest whose most common key carries at most this share."""


@dataclass(frozen=True)
class Outcome:
    """One policy's figures for the newcomer (ratios in [0, 1]; tokens)."""

    policy: str
    hit_1m: float
    hit_5m: float
    hit_all: float
    cold_5m: int
    spent: int
    saved: int
    saved_5m: int

    @property
    def yield_(self) -> float:
        return self.saved / self.spent if self.spent else 0.0


@dataclass(frozen=True)
class TraceResult:
    """A trace's figures: its size, the join (s, the trace's clock), the routing depth, the replica the
    newcomer takes most from, each policy's outcome, the established replicas' hit ratios after the join
    (1 min, 5 min, all) and the unwarmed newcomer's steady hit ratio."""

    name: str
    requests: int
    join_t: float
    routing_depth: int
    donor: str
    new_requests: int
    outcomes: list[Outcome]
    established: tuple[float, float, float]
    steady: float
    ceiling: Outcome
    frontier: list[Point]
    """The planner's policy at each spend knob (`frontier.SWEEP`)."""
    ceiling_curve: list[Point]
    reliability: list[ReliabilityRow]
    """The newcomer's candidates' calibrated probabilities against its use of them in the ramp window."""
    calibration_gap: float
    calibration: str
    """How the planner's map was fitted at the join: on how many prefixes, or the prior."""
    empty_plan: str | None
    """The planner's one line when it would issue the newcomer an empty plan ("warming buys little ...")."""

    def by_policy(self, policy: str) -> Outcome:
        """The outcome of `policy`; raises `KeyError` for a policy not run."""
        for outcome in self.outcomes:
            if outcome.policy == policy:
                return outcome
        raise KeyError(policy)


def hit_ratio(served: Sequence[Served], start: float, end: float) -> float:
    """Cached blocks over prompt blocks of the requests that arrived in [start, end)."""
    window = [s for s in served if start <= s.t < end]
    blocks = sum(s.blocks for s in window)
    return sum(s.hit_blocks for s in window) / blocks if blocks else 0.0


def outcome(policy: str, served: list[Served], unwarmed: list[Served], spent: int, join_t: float) -> Outcome:
    """`policy`'s figures from what the newcomer `served` warmed and `unwarmed` (the same requests)."""
    five = join_t + 300
    return Outcome(
        policy,
        hit_ratio(served, join_t, join_t + 60),
        hit_ratio(served, join_t, five),
        hit_ratio(served, join_t, float("inf")),
        sum(1 for s in served if s.t < five and s.hit_blocks == 0),
        spent,
        sum(s.hit_tokens for s in served) - sum(s.hit_tokens for s in unwarmed),
        sum(a.hit_tokens - b.hit_tokens for a, b in zip(served, unwarmed, strict=True) if a.t < five),
    )


def evaluate(name: str, requests: Sequence[Request], params: EvalParams) -> TraceResult:
    """Simulate `requests` (in arrival order, at least one) once unwarmed for the whole fleet, then the
    newcomer under each policy. Raises `ValueError` for no requests."""
    if not requests:
        raise ValueError(f"{name}: no requests to evaluate")
    depth = (
        auto_routing_depth(requests, _MAX_KEY_SHARE) if params.routing_depth is None else params.routing_depth
    )
    keyed = with_routing_depth(requests, depth)
    join_t = keyed[0].t + params.join_at * (keyed[-1].t - keyed[0].t)
    established = [f"r{i}" for i in range(params.replicas)]
    before = HashRing(established, load_factor=params.load_factor)
    after = HashRing([*established, NEW], load_factor=params.load_factor)
    replicas = route(keyed, before, after, join_t, params.load_window)
    newcomer = [r for r, replica in zip(keyed, replicas, strict=True) if replica == NEW]
    donors = [before.owner(r.key) for r in newcomer]
    donor = max(set(donors), key=lambda member: (donors.count(member), member)) if donors else ""
    donor_recent, served_old = _serve_established(
        keyed, replicas, established, donor=donor, join_t=join_t, params=params
    )
    history = [r for r in keyed if r.t < join_t]
    view = planner_view(history, join_t, after, depth, params)
    setup = Setup(history, join_t, before, after, depth, donor_recent, params, view, name)
    outcomes: list[Outcome] = []
    unwarmed: list[Served] = []
    for policy, choose in POLICIES.items():
        cache, spent = warm_cache(params.capacity_blocks, choose(setup))
        served = [serve(cache, request, NEW) for request in newcomer]
        unwarmed = unwarmed or served
        outcomes.append(outcome(policy, served, unwarmed, spent, join_t))
    best = ceiling_blocks(history, newcomer, join_t, params)
    cache, spent = warm_cache(params.capacity_blocks, best)
    ceiling = outcome("(ceiling)", [serve(cache, r, NEW) for r in newcomer], unwarmed, spent, join_t)
    after_join = [s for s in served_old if s.t >= join_t]
    frontier = sweep(setup, newcomer)
    decision = warmplane_decision(setup, params.min_reuse).message
    rows, gap = reliability_rows(setup, newcomer)
    fitted = view.calibration
    how = (
        f"fitted on {fitted.samples:,} prefixes"
        if fitted.fitted
        else f"the prior ({fitted.samples} prefixes)"
    )
    return TraceResult(
        name,
        len(keyed),
        join_t,
        depth,
        donor,
        len(newcomer),
        outcomes,
        (
            hit_ratio(after_join, join_t, join_t + 60),
            hit_ratio(after_join, join_t, join_t + 300),
            hit_ratio(after_join, join_t, float("inf")),
        ),
        hit_ratio(unwarmed, join_t + 300, float("inf")),
        ceiling,
        frontier,
        ceiling_curve(best, [point.tokens for point in frontier], newcomer, setup),
        rows,
        gap,
        how,
        decision,
    )


def ceiling_blocks(
    history: Sequence[Request], newcomer: Sequence[Request], join_t: float, params: EvalParams
) -> WarmBlocks:
    """The blocks seen before the join that the newcomer requests within 5 minutes of it, in order of
    first use, within the token limit (a block seen implies its ancestors were: chains are prefixes)."""
    seen = {block for request in history for block in request.chain}
    chosen: WarmBlocks = []
    taken: set[int] = set()
    used = 0
    for request in newcomer:
        if request.t >= join_t + 300:
            break
        for block, tokens in zip(request.chain, request.own_tokens, strict=True):
            if block not in seen or block in taken:
                continue
            if used + tokens > params.limit_tokens:
                return chosen
            taken.add(block)
            chosen.append((block, tokens))
            used += tokens
    return chosen


def _serve_established(
    requests: Sequence[Request],
    replicas: Sequence[str],
    established: Sequence[str],
    *,
    donor: str,
    join_t: float,
    params: EvalParams,
) -> tuple[list[tuple[int, int]], list[Served]]:
    """Serve the `established` replicas' requests (each routed to `replicas[i]`); the donor's most recent
    blocks at the join (up to the warm-set cap, most recent first; none without a donor) and what each of
    those requests found."""
    caches = {replica: LruCache(params.capacity_blocks) for replica in established}
    donor_recent: list[tuple[int, int]] = []
    served_old: list[Served] = []
    for request, replica in zip(requests, replicas, strict=True):
        if request.t >= join_t and not donor_recent and donor:
            donor_recent = caches[donor].most_recent(params.limit_tokens)
        if replica != NEW:
            served_old.append(serve(caches[replica], request, replica))
    return donor_recent, served_old
