"""A trace-evaluation baseline, the simple warm-set policy: the most valuable catalogued prefixes under a
token budget. Pure: no I/O.

A prefix's value is the requests that went through it (its subtree's count in the recency window) times
its cumulative tokens: the prefill a warm copy would have saved them. Warming a prefix warms its whole
chain, so an ancestor is skipped once chosen descendants carry all of its requests; along a run of equal
counts the deepest catalogued prefix (the most tokens) wins. Prefixes are keyed by (scope id, prefix id):
prefix ids are namespaced by scope.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from warmplane.services.planner.policy.replica_plan import NodeKey


@dataclass(frozen=True, slots=True)
class PrefixNode:
    """A prefix in the trie: its parent (None at a root), depth (0 at a root) and cumulative tokens."""

    key: NodeKey
    parent: NodeKey | None
    depth: int
    tokens: int


@dataclass(frozen=True, slots=True)
class Candidate:
    """A prefix that may be warmed: `requests` went through it; `catalogued` if a payload renders it."""

    node: PrefixNode
    requests: int
    catalogued: bool

    @property
    def value(self) -> int:
        """Tokens a warm copy would have saved in the window: requests through it times its tokens."""
        return self.requests * self.node.tokens


def requests_through(nodes: Iterable[PrefixNode], leaf_requests: Mapping[NodeKey, int]) -> dict[NodeKey, int]:
    """For every prefix of `nodes` with traffic below it: the sum of `leaf_requests` over its subtree.

    `leaf_requests` counts requests by the prefix they ended at (a request counts at its deepest chain
    element only). A leaf missing from `nodes` counts for itself alone; a parent missing from `nodes`
    stops the walk up (the trie is handed whole, so that only happens for data being retired).
    """
    parents = {node.key: node.parent for node in nodes}
    through: dict[NodeKey, int] = {}
    for leaf, count in leaf_requests.items():
        if count <= 0:
            continue
        key: NodeKey | None = leaf
        seen = 0
        while key is not None and seen <= len(parents):  # the bound guards against a cycle in bad data
            through[key] = through.get(key, 0) + count
            key = parents.get(key)
            seen += 1
    return through


def choose_warm_set(
    candidates: Iterable[Candidate], *, budget_tokens: int, max_items: int
) -> list[Candidate]:
    """The prefixes to warm, ancestors before descendants (by depth, then value, then key).

    `candidates` are every prefix with traffic, catalogued or not: coverage climbs through them.
    Greedy by value among catalogued candidates with requests and tokens: a candidate is taken when its
    tokens fit what remains of `budget_tokens` and its chosen descendants do not already carry all of
    its requests. The sum of the chosen tokens never exceeds `budget_tokens` (each item is costed at
    its full tokens: a warmer that reuses a chosen ancestor's cache spends less), and at most
    `max_items` are chosen. Deterministic: ties break deeper first, then by key.
    """
    by_key = {c.node.key: c for c in candidates}
    eligible = [c for c in by_key.values() if c.catalogued and c.requests > 0 and c.node.tokens > 0]
    eligible.sort(key=lambda c: (-c.value, -c.node.depth, c.node.key))
    covered: dict[NodeKey, int] = {}
    """Per prefix, how many of its requests go through chosen prefixes below it."""
    chosen: list[Candidate] = []
    remaining = budget_tokens
    for candidate in eligible:
        if len(chosen) >= max_items:
            break
        key = candidate.node.key
        if candidate.node.tokens > remaining or covered.get(key, 0) >= candidate.requests:
            continue
        chosen.append(candidate)
        remaining -= candidate.node.tokens
        # Traffic already covered below this prefix was added to its ancestors when that was chosen.
        added = candidate.requests - covered.get(key, 0)
        covered[key] = candidate.requests
        parent = candidate.node.parent
        hops = 0
        while parent is not None and hops < len(by_key):
            covered[parent] = covered.get(parent, 0) + added
            above = by_key.get(parent)
            parent = above.node.parent if above is not None else None
            hops += 1
    chosen.sort(key=lambda c: (c.node.depth, -c.value, c.node.key))
    return chosen
