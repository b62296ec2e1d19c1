"""The warm sets the evaluator compares for a replica joining mid-trace, each from what is known at the join.

`none`; `seed-replay` (the last 500 distinct request chains seen fleet-wide, the seed's documents);
`top-50` (the planner's simple policy: requests x tokens over the history, 50 items); `peer-copy` (the
most recent blocks of the replica the newcomer takes most traffic from); `warmplane` (the planner's own
path: the history bucketed as the planner stores it, then `policy.trie_from_counts` and
`policy.choose_for_replica`); `warmplane-spread` (the same, planned for a router that is not the ring,
`WARMPLANE_ROUTING__MODE=spread`, and then routed by the ring). All but the seed replay are held to
`EvalParams.limit_tokens`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from warmplane.services.planner.policy import (
    PolicyKnobs,
    PrefixTrie,
    ReuseCalibration,
    RingSpec,
    WarmBudget,
    WarmDecision,
    WarmThresholds,
    choose_for_replica,
    decide_warm,
    fit_calibration,
    trie_from_counts,
)
from warmplane.services.planner.trace_eval.fleet_sim import LruCache, Request
from warmplane.services.planner.trace_eval.params import EvalParams
from warmplane.services.planner.trace_eval.simple_plan import (
    Candidate,
    PrefixNode,
    choose_warm_set,
    requests_through,
)
from warmplane.services.planner.trace_eval.store_sim import stored_history
from warmplane.shared.hash_ring import HashRing

NEW = "new"
"""The joining replica's name."""
WarmBlocks = list[tuple[int, int]]
"""Blocks to pre-fill, (id, own tokens), each after its parent."""


@dataclass(frozen=True)
class Setup:
    """Everything a policy may know at the join: history, rings, the newcomer's routing share, the limit."""

    history: list[Request]
    join_t: float
    before: HashRing
    after: HashRing
    routing_depth: int
    donor_recent: WarmBlocks
    params: EvalParams
    planner: PlannerView
    model: str
    """What the trace is named by in the planner's one-line reasons."""


def seed_replay(setup: Setup) -> WarmBlocks:
    """The last 500 distinct request chains, oldest first, each block once."""
    latest: dict[int, Request] = {}
    for request in setup.history:
        latest.pop(request.chain[-1], None)
        latest[request.chain[-1]] = request
    return _chains_to_blocks(list(latest.values())[-500:])


def top_50(setup: Setup) -> WarmBlocks:
    """The planner's simple policy over the whole history: requests x tokens, 50 items, the token limit."""
    nodes: dict[int, PrefixNode] = {}
    leaves: dict[tuple[int, int], int] = {}
    for request in setup.history:
        parent = None
        for depth, (block, tokens) in enumerate(zip(request.chain, request.cumulative, strict=True)):
            nodes.setdefault(block, PrefixNode((0, block), parent, depth, tokens))
            parent = (0, block)
        leaves[(0, request.chain[-1])] = leaves.get((0, request.chain[-1]), 0) + 1
    through = requests_through(nodes.values(), leaves)
    candidates = [Candidate(node, through.get(node.key, 0), True) for node in nodes.values()]
    chosen = choose_warm_set(candidates, budget_tokens=setup.params.limit_tokens, max_items=50)
    blocks: WarmBlocks = []
    seen: set[int] = set()
    for candidate in chosen:
        path = []
        node: PrefixNode | None = candidate.node
        while node is not None and node.key[1] not in seen:
            up = nodes[node.parent[1]] if node.parent is not None else None
            path.append((node.key[1], node.tokens - (up.tokens if up is not None else 0)))
            node = up
        blocks += reversed(path)
        seen.update(block for block, _ in path)
    return blocks


def peer_copy(setup: Setup) -> WarmBlocks:
    """The donor's most recent blocks at the join, up to the token limit, least recent first."""
    return list(reversed(setup.donor_recent))


@dataclass(frozen=True)
class PlannerView:
    """What the planner knows at the join, as it would read it: the trie of the history stored as it
    stores it, the calibration fitted on that history, and the ring it plans the newcomer on."""

    trie: PrefixTrie
    calibration: ReuseCalibration
    knobs: PolicyKnobs
    ring: RingSpec
    members: list[str]


def planner_view(
    history: Sequence[Request], join_t: float, after: HashRing, routing_depth: int, params: EvalParams
) -> PlannerView:
    """The history stored as the planner stores it (each prefix's parent and cumulative tokens, requests
    per leaf and `bucket_seconds` bucket; or as a variant store would, `store_sim.stored_history`), then
    `trie_from_counts` and `fit_calibration`, as `plan_choice.WarmSetChooser` calls them."""
    stored, leaves = stored_history(
        history,
        bucket_seconds=params.bucket_seconds,
        admit_after=params.admit_after,
        store_nodes=params.store_nodes,
    )
    knobs = PolicyKnobs(
        params.half_life,
        params.frequency_half_life,
        params.ramp_window,
        params.min_reuse,
        params.capacity_fraction,
        params.min_saved_tokens,
    )
    trie, _left_out = trie_from_counts(stored, leaves, join_t, knobs.half_life_s, knobs.frequency_half_life_s)
    return PlannerView(
        trie,
        fit_calibration(stored, leaves, join_t, knobs),
        knobs,
        RingSpec(routing_depth, after.vnodes, after.load_factor),
        list(after.weights),
    )


def warmplane_at(setup: Setup, min_reuse: float) -> WarmBlocks:
    """What the planner issues with its least reuse probability at `min_reuse`: `choose_for_replica` on
    the planner's view for the newcomer among the ring's replicas, calibrated, its KV capacity capped at
    `capacity_fraction`, then `decide_warm` (no readiness budget: prefill is instantaneous here). Every
    block counts as renderable (the simulation replays blocks, not payloads)."""
    return [(item.prefix_id, item.cost_tokens) for item in warmplane_decision(setup, min_reuse).items]


def warmplane_decision(setup: Setup, min_reuse: float, *, spread: bool = False) -> WarmDecision:
    """`warmplane_at`'s decision: the items, or none and why. `spread` plans as the planner does for a
    router that is not its ring (`WARMPLANE_ROUTING__MODE=spread`)."""
    params, view = setup.params, setup.planner
    items, _limit = choose_for_replica(
        view.trie,
        setup.join_t,
        replica=NEW,
        members=view.members,
        ring=replace(view.ring, spread=spread),
        budget=WarmBudget(tokens=params.limit_tokens),
        kv_capacity_tokens=params.capacity_blocks * params.block_tokens,
        knobs=replace(view.knobs, min_reuse_probability=min_reuse),
        calibration=view.calibration,
    )
    thresholds = WarmThresholds(view.knobs.min_expected_saved_tokens, math.inf, None, min_reuse)
    return decide_warm(setup.model, items, thresholds)


def warmplane(setup: Setup) -> WarmBlocks:
    """What the planner issues at its defaults (`warmplane_at` the default least reuse probability)."""
    return warmplane_at(setup, setup.params.min_reuse)


POLICIES: dict[str, Callable[[Setup], WarmBlocks]] = {
    "none": lambda setup: [],
    "seed-replay": seed_replay,
    "top-50": top_50,
    "peer-copy": peer_copy,
    "warmplane": warmplane,
    # Planned without knowing the ring, routed by it: what not knowing the router costs.
    "warmplane-spread": lambda setup: [
        (item.prefix_id, item.cost_tokens)
        for item in warmplane_decision(setup, setup.params.min_reuse, spread=True).items
    ],
}


def _chains_to_blocks(requests: Sequence[Request]) -> WarmBlocks:
    blocks: WarmBlocks = []
    seen: set[int] = set()
    for request in requests:
        for block, tokens in zip(request.chain, request.own_tokens, strict=True):
            if block not in seen:
                seen.add(block)
                blocks.append((block, tokens))
    return blocks


def warm_cache(capacity_blocks: int, blocks: WarmBlocks) -> tuple[LruCache, int]:
    """A fresh cache pre-filled with `blocks`, children touched before parents (heads end most recent);
    returns it and the prefill tokens spent."""
    cache = LruCache(capacity_blocks)
    spent = sum(cache.touch([block], [tokens]) for block, tokens in reversed(blocks))
    return cache, spent
