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
from collections.abc import Collection, Container
from dataclasses import dataclass

from warmplane.services.planner.policy.budget import WarmBudget
from warmplane.services.planner.policy.prefix_trie import PrefixTrie, TrieNode
from warmplane.services.planner.policy.routing_share import RoutingShare


@dataclass(frozen=True, slots=True)
class WarmItem:
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


def _shared_prefixes(trie: PrefixTrie, share: RoutingShare) -> dict[int, bool]:
    """Per known prefix, whether it is in `share`; computed down the trie (parents are seen first)."""
    owned: dict[int, bool] = {}
    for node in trie.nodes():
        if node.depth < share.routing_depth:
            owned[node.prefix_id] = True
        elif node.depth == share.routing_depth:
            owned[node.prefix_id] = share.owns_key(node.prefix_id)
        else:
            owned[node.prefix_id] = node.parent is not None and owned.get(node.parent, False)
    return owned


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
) -> list[WarmItem]:
    """The prefixes to pre-fill on `share.replica` at `now`, ancestors before descendants.

    Contract: every item is in `share` and not in `resident` (prefix ids the replica already holds, taken
    with their chains); the items' `cost_tokens` sum to at most `budget.token_limit(kv_capacity_tokens,
    capacity_fraction)`; an item's parent is resident or listed before it; only blocks at least
    `min_reuse_probability` likely to be reused, and in `renderable` when it is given, are chosen for
    themselves (their ancestors come with them); at most `max_items` of the items are in `renderable` (all
    of them count when it is None). Deterministic for equal inputs. Raises `ValueError` as
    `WarmBudget.token_limit` does.
    """
    remaining = budget.token_limit(kv_capacity_tokens, capacity_fraction)
    owned = _shared_prefixes(trie, share)
    covered = set(resident)
    probabilities: dict[int, float] = {}
    for node in trie.nodes():
        if owned[node.prefix_id] and node.prefix_id not in covered:
            rate = trie.rate(node.prefix_id, now)
            if node.depth < share.routing_depth:
                rate *= share.weight_fraction
            probabilities[node.prefix_id] = reuse_probability(rate, ramp_window_s)
    scored = [
        (probability, node)
        for node in trie.nodes()
        if (probability := probabilities.get(node.prefix_id, 0.0)) > 0
        and probability >= min_reuse_probability
        and node.own_tokens > 0
        and (renderable is None or node.prefix_id in renderable)
    ]
    scored.sort(key=lambda pair: (-pair[0], pair[1].depth, pair[1].prefix_id))
    chosen: list[WarmItem] = []
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
                WarmItem(
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
