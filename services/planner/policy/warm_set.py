"""Warm-set selection for one replica by marginal gain under a budget. Pure: no I/O, no clock.

Gain: a cold replica pays a prefix's prefill once, on its first use, and hits it afterwards; a warm copy
saves exactly that first prefill. So the expected tokens a warm block saves in the ramp window are its own
tokens times the probability that the replica's traffic uses it at least once in the window,
1 - exp(-rate * window), with the rate estimated from the decayed counts and counted only for traffic the
ring sends to the replica. Warming a prefix warms its whole chain, so a prefix costs its own tokens once its
ancestors are warm or resident.

Selection is greedy by that probability (the gain per token of a block), deepest last on ties: a prefix is
never more likely to be used than its parent, so ancestors come first by construction, and an ancestor that
is not chosen on its own is added (and paid for) with its first chosen descendant. When only some prefixes
can be rendered (the planner warms a prefix by replaying its catalogued payload, which renders its whole
chain), only those are chosen for themselves; their ancestors still come along, warmed by their payloads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Container, Mapping
from dataclasses import dataclass

from warmplane.services.planner.policy.budget import WarmBudget
from warmplane.services.planner.policy.prefix_trie import PrefixTrie, TrieNode
from warmplane.services.planner.policy.routing_share import RoutingShare
from warmplane.shared.hash_ring import HashRing


@dataclass(frozen=True, slots=True)
class ChosenPrefix:
    """One prefix to warm: its cumulative `tokens`, the prefill `cost_tokens` it adds once the items before
    it are warm (its own block's tokens), and the probability that its block is reused in the ramp window."""

    prefix_id: int
    depth: int
    tokens: int
    cost_tokens: int
    reuse_probability: float


def reuse_probability(rate_per_s: float, window_s: float) -> float:
    """The chance of at least one use in `window_s` seconds of Poisson traffic at `rate_per_s`, in [0, 1)."""
    return -math.expm1(-max(0.0, rate_per_s) * max(0.0, window_s))


def select_warm_set(
    trie: PrefixTrie,
    now: float,
    *,
    share: RoutingShare,
    budget: WarmBudget,
    kv_capacity_tokens: int,
    capacity_fraction: float = 0.5,
    ramp_window_s: float = 300.0,
    min_reuse_probability: float = 0.0,
    resident: Collection[int] = frozenset(),
    renderable: Container[int] | None = None,
    max_items: int | None = None,
) -> list[ChosenPrefix]:
    """The prefixes to pre-fill on `share.replica` at `now`, ancestors before descendants.

    Contract: every item is in `share` and not in `resident` (prefix ids the replica already holds, taken
    with their chains); the items' `cost_tokens` sum to at most `budget.token_limit(kv_capacity_tokens,
    capacity_fraction)`; an item's parent is resident or listed before it; only blocks at least
    `min_reuse_probability` likely to be reused, and in `renderable` when it is given, are chosen for
    themselves (their ancestors come with them); at most `max_items` of the items are in `renderable` (all
    of them count when it is None). Deterministic for equal inputs. Raises `ValueError` as
    `WarmBudget.token_limit` does.
    """
    limit = budget.token_limit(kv_capacity_tokens, capacity_fraction)
    return select_warm_sets(
        trie,
        now,
        ring=share.ring,
        routing_depth=share.routing_depth,
        limits={share.replica: limit},
        ramp_window_s=ramp_window_s,
        min_reuse_probability=min_reuse_probability,
        resident={share.replica: resident},
        renderable=renderable,
        max_items=max_items,
    )[share.replica]


def select_warm_sets(
    trie: PrefixTrie,
    now: float,
    *,
    ring: HashRing,
    routing_depth: int,
    limits: Mapping[str, int],
    ramp_window_s: float,
    min_reuse_probability: float,
    resident: Mapping[str, Collection[int]] | None = None,
    renderable: Container[int] | None = None,
    max_items: int | None = None,
    calibration: Callable[[float], float] | None = None,
) -> dict[str, list[ChosenPrefix]]:
    """`select_warm_set` for every replica of `limits` (its token limit) at once, each under its
    `RoutingShare(ring, replica, routing_depth)` and minus its `resident` prefixes: each result equals
    that replica's alone, but the trie is walked and the ring asked once for all of them, not once per
    replica. A fleet re-plan (a deploy, an epoch bump) is thus one pass over the trie plus each replica's
    own part of it: with a thousand replicas the per-replica walk would repeat the whole trie and build
    the ring a thousand times. With `calibration`, a block's probability is `calibration(score)` of its
    Poisson score (`calibration.py`), and `min_reuse_probability` applies to that. Raises `ValueError`
    for a replica the ring does not hold.
    """
    candidates = candidate_probabilities(
        trie,
        now,
        ring=ring,
        routing_depth=routing_depth,
        replicas=list(limits),
        ramp_window_s=ramp_window_s,
        resident=resident,
        calibration=calibration,
    )
    return {
        replica: _greedy(
            trie,
            candidates[replica],
            set(resident.get(replica, ()) if resident is not None else ()),
            limit=limit,
            min_reuse_probability=min_reuse_probability,
            renderable=renderable,
            max_items=max_items,
        )
        for replica, limit in limits.items()
    }


def candidate_probabilities(
    trie: PrefixTrie,
    now: float,
    *,
    ring: HashRing,
    routing_depth: int,
    replicas: Collection[str],
    ramp_window_s: float,
    resident: Mapping[str, Collection[int]] | None = None,
    calibration: Callable[[float], float] | None = None,
) -> dict[str, dict[int, float]]:
    """Each replica's candidates: every prefix in its share and not `resident` on it, with its probability
    of reuse by the replica's traffic in the ramp window: `calibration` (`calibration.py`) of its expected
    uses there (its rate, times its ring share above the routing depth, times the window), or without one
    the Poisson chance of at least one use. Raises
    `ValueError` for a replica the ring does not hold."""
    missing = sorted(set(replicas) - set(ring.weights))
    if missing:
        raise ValueError(f"replicas {missing} are not on the ring")
    shared, owned = _partition(trie, ring, routing_depth, set(replicas))
    total_weight = sum(ring.weights.values())
    mapped = calibration if calibration is not None else _poisson
    own_probabilities = {
        node.prefix_id: mapped(trie.rate(node.prefix_id, now) * ramp_window_s)
        for nodes in owned.values()
        for node in nodes
    }
    shared_rates = [(node, trie.rate(node.prefix_id, now)) for node in shared]
    candidates: dict[str, dict[int, float]] = {}
    for replica in replicas:
        fraction = ring.weights[replica] / total_weight
        covered = set(resident.get(replica, ()) if resident is not None else ())
        probabilities = {
            node.prefix_id: mapped(rate * fraction * ramp_window_s)
            for node, rate in shared_rates
            if node.prefix_id not in covered
        }
        for node in owned.get(replica, ()):
            if node.prefix_id not in covered:
                probabilities[node.prefix_id] = own_probabilities[node.prefix_id]
        candidates[replica] = probabilities
    return candidates


def _poisson(expected_uses: float) -> float:
    """The uncalibrated probability: `reuse_probability` of `expected_uses` in the window."""
    return reuse_probability(expected_uses, 1.0)


def _partition(
    trie: PrefixTrie, ring: HashRing, routing_depth: int, replicas: Container[str]
) -> tuple[list[TrieNode], dict[str, list[TrieNode]]]:
    """The prefixes above `routing_depth` (in every replica's share), and those at it or below by the
    ring's owner of their routing key, for the owners in `replicas`; one pass, parents before children."""
    shared: list[TrieNode] = []
    owners: dict[int, str] = {}
    owned: dict[str, list[TrieNode]] = {}
    for node in trie.nodes():
        if node.depth < routing_depth:
            shared.append(node)
            continue
        if node.depth == routing_depth:
            owner = ring.owner(node.prefix_id)
        else:
            parent = owners.get(node.parent) if node.parent is not None else None
            if parent is None:
                continue
            owner = parent
        owners[node.prefix_id] = owner
        if owner in replicas:
            owned.setdefault(owner, []).append(node)
    return shared, owned


def _greedy(
    trie: PrefixTrie,
    probabilities: Mapping[int, float],
    covered: set[int],
    *,
    limit: int,
    min_reuse_probability: float,
    renderable: Container[int] | None,
    max_items: int | None,
) -> list[ChosenPrefix]:
    """The greedy selection over the candidates `probabilities` names (each prefix in the share and not
    `covered`, with its reuse probability), within `limit` tokens; updates `covered`."""
    remaining = limit
    scored = [
        (probability, node)
        for prefix_id, probability in probabilities.items()
        if probability > 0
        and probability >= min_reuse_probability
        and (node := trie.node(prefix_id)) is not None
        and node.own_tokens > 0
        and (renderable is None or prefix_id in renderable)
    ]
    scored.sort(key=lambda pair: (-pair[0], pair[1].depth, pair[1].prefix_id))
    chosen: list[ChosenPrefix] = []
    rendered = 0
    items_left = max_items if max_items is not None else len(probabilities)
    for _, node in scored:
        if remaining <= 0 or rendered >= items_left:
            break
        if node.prefix_id in covered:
            continue
        path = _uncovered_path(trie, node, covered)
        cost = sum(step.own_tokens for step in path)
        renders = sum(1 for step in path if renderable is None or step.prefix_id in renderable)
        if cost > remaining or rendered + renders > items_left:
            continue
        remaining -= cost
        rendered += renders
        for step in path:
            covered.add(step.prefix_id)
            chosen.append(
                ChosenPrefix(
                    step.prefix_id, step.depth, step.tokens, step.own_tokens, probabilities[step.prefix_id]
                )
            )
    return chosen


def _uncovered_path(trie: PrefixTrie, node: TrieNode, covered: set[int]) -> list[TrieNode]:
    """`node` and its ancestors up to the first covered one, root-most first."""
    path: list[TrieNode] = []
    step: TrieNode | None = node
    while step is not None and step.prefix_id not in covered and len(path) <= node.depth:
        path.append(step)
        step = trie.node(step.parent) if step.parent is not None else None
    path.reverse()
    return path
