"""A prefix trie over chains with time-decayed use counts. Pure: no I/O, no clock (callers pass `now`).

A chain is a list of prefix ids, each standing for its block and every block before it, with the cumulative
tokens up to each block. Every request observed through a prefix adds one to its count, and counts decay
exponentially with a half-life: a count of c stamped at time t is worth c * 2 ** (-(now - t) / half_life)
at `now`, and a count times ln 2 / half-life estimates the prefix's rate in requests per second. A short
half-life follows recency, a long one frequency. Conversations reward the first (a chat resumed minutes
later) and shared documents the second (used all hour, not in the last minute), so a trie can be
`blend`ed with a second one of the same observations at a shorter half-life: its rate is then the mean
of the two estimates.

Invariants: a prefix's decayed count is at least any of its children's (every observation through a child
went through it too); a decayed count never grows between observations.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class TrieNode:
    """One prefix: its parent (None at a root), depth (0 at a root), cumulative `tokens` up to and
    including its block, `own_tokens` of its block alone, and its use count as of `stamp` (seconds),
    before decay."""

    prefix_id: int
    parent: int | None
    depth: int
    tokens: int
    own_tokens: int
    count: float
    stamp: float


class PrefixTrie:
    """Decayed request counts per prefix. Raises `ValueError` for a half-life that is not positive."""

    def __init__(self, half_life_s: float) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be positive, got {half_life_s}")
        self.half_life_s = half_life_s
        self._nodes: dict[int, TrieNode] = {}
        self._fast: PrefixTrie | None = None

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, prefix_id: object) -> bool:
        return prefix_id in self._nodes

    def nodes(self) -> Iterator[TrieNode]:
        """Every known prefix, parents before their children (insertion order)."""
        return iter(self._nodes.values())

    def node(self, prefix_id: int) -> TrieNode | None:
        """The prefix `prefix_id`, or None if it was never observed (or was pruned)."""
        return self._nodes.get(prefix_id)

    def decay_factor(self, elapsed_s: float) -> float:
        """What one use is worth `elapsed_s` seconds later: 2 ** (-elapsed_s / half-life)."""
        return math.exp(-elapsed_s * math.log(2) / self.half_life_s)

    def count(self, prefix_id: int, now: float) -> float:
        """The decayed count of `prefix_id` at `now`: the sum over its observations at times t of
        2 ** (-(now - t) / half-life), so 0 for an unknown prefix, never more than at any earlier `now`
        without observations in between, and never less than any child's."""
        node = self._nodes.get(prefix_id)
        return 0.0 if node is None else node.count * self.decay_factor(now - node.stamp)

    def rate(self, prefix_id: int, now: float) -> float:
        """Estimated requests per second through `prefix_id` at `now`: the decayed count over the decay's
        integral (half-life / ln 2); blended, the mean of that and the faster trie's estimate."""
        own = self.count(prefix_id, now) * math.log(2) / self.half_life_s
        return own if self._fast is None else (own + self._fast.rate(prefix_id, now)) / 2

    @property
    def blended(self) -> PrefixTrie | None:
        """The faster trie this one is blended with (`blend`), if any: what observes into this one after
        the build must observe into it too."""
        return self._fast

    def blend(self, fast: PrefixTrie) -> None:
        """Estimate rates (`rate`) as the mean of this trie's and `fast`'s: the same observations counted
        with a shorter half-life, which `fast` must have (`ValueError` otherwise). `fast` may lack prefixes
        whose counts decayed to nothing there; they count 0 in it. Counts and nodes stay this trie's."""
        if not fast.half_life_s < self.half_life_s:
            raise ValueError(
                f"a blended trie's half-life ({fast.half_life_s:g} s) must be shorter than"
                f" {self.half_life_s:g} s"
            )
        self._fast = fast

    def observe(self, chain: Sequence[int], tokens: Sequence[int], now: float, weight: float = 1.0) -> None:
        """Count `weight` requests (one by default; the planner hands a leaf's decayed total at once)
        through every prefix of `chain` at `now` (seconds). `tokens[i]` is the cumulative token count up to
        `chain[i]`. An observation older than a prefix's stamp (late delivery) counts as already decayed to
        that stamp. A known prefix keeps its first parent and the largest token count seen.

        Raises `ValueError` when the lengths differ, `tokens` is not positive and non-decreasing, or
        `weight` is not positive; the trie is unchanged then.
        """
        if not weight > 0:
            raise ValueError(f"weight must be positive, got {weight}")
        if len(chain) != len(tokens):
            raise ValueError(f"chain has {len(chain)} ids but tokens has {len(tokens)} counts")
        if any(t <= 0 for t in tokens[:1]) or any(b < a for a, b in itertools.pairwise(tokens)):
            raise ValueError(f"tokens must be positive and non-decreasing, got {list(tokens)}")
        parent: int | None = None
        parent_tokens = 0
        for depth, (prefix_id, cumulative) in enumerate(zip(chain, tokens, strict=True)):
            node = self._nodes.get(prefix_id)
            if node is None:
                node = TrieNode(prefix_id, parent, depth, cumulative, cumulative - parent_tokens, 0.0, now)
                self._nodes[prefix_id] = node
            elif cumulative > node.tokens:
                node.own_tokens += cumulative - node.tokens
                node.tokens = cumulative
            if now >= node.stamp:
                node.count = node.count * self.decay_factor(now - node.stamp) + weight
                node.stamp = now
            else:
                node.count += weight * self.decay_factor(node.stamp - now)
            parent, parent_tokens = prefix_id, node.tokens

    def observe_all(
        self, observations: Iterable[tuple[Sequence[int], Sequence[int], float]], now: float
    ) -> int:
        """`observe(chain, tokens, now, weight)` for each `(chain, tokens, weight)` in turn, with the same
        result, in one pass without a call per chain (a planner's trie counts tens of thousands of
        leaves at once); returns how many were refused (what `observe` would raise `ValueError` for,
        each leaving the trie as it was)."""
        nodes = self._nodes
        refused = 0
        for chain, tokens, weight in observations:
            ordered = sorted(tokens)  # positive and non-decreasing: sorted already, least above 0
            if (
                not weight > 0
                or len(chain) != len(tokens)
                or ordered != list(tokens)
                or (ordered and ordered[0] <= 0)
            ):
                refused += 1
                continue
            parent: int | None = None
            parent_tokens = 0
            for depth, (prefix_id, cumulative) in enumerate(zip(chain, tokens, strict=True)):
                node = nodes.get(prefix_id)
                if node is None:
                    node = nodes[prefix_id] = TrieNode(
                        prefix_id, parent, depth, cumulative, cumulative - parent_tokens, weight, now
                    )
                else:
                    if cumulative > node.tokens:
                        node.own_tokens += cumulative - node.tokens
                        node.tokens = cumulative
                    if node.stamp == now:
                        node.count += weight
                    elif now > node.stamp:
                        node.count = node.count * self.decay_factor(now - node.stamp) + weight
                        node.stamp = now
                    else:
                        node.count += weight * self.decay_factor(node.stamp - now)
                parent, parent_tokens = prefix_id, node.tokens
        return refused

    def observe_leaves(
        self,
        leaves: Iterable[tuple[int, float]],
        parents: Mapping[int, int | None],
        tokens: Mapping[int, int],
        now: float,
    ) -> None:
        """`observe(chain, chain's tokens, now, weight)` for each `(leaf, weight)` in turn, with the same
        result, where a leaf's chain is its path up `parents` (None above a root) and `tokens` holds each
        prefix's cumulative tokens. A chain's prefixes are made only down from the deepest one already
        known, and no list is built per chain: a planner's trie counts tens of thousands of leaves whose
        chains share their upper prefixes (`bench.plan_scale_bench` times the build).

        The chains must be what `observe` accepts (the caller checked: loop-free, `tokens` positive and
        non-decreasing down each), and a known prefix's parent and tokens the chain's."""
        nodes = self._nodes
        for leaf, weight in leaves:
            if leaf not in nodes:
                missing: list[int] = []
                prefix: int | None = leaf
                while prefix is not None and prefix not in nodes:
                    missing.append(prefix)
                    prefix = parents[prefix]
                above = None if prefix is None else nodes[prefix]
                for prefix_id in reversed(missing):
                    cumulative = tokens[prefix_id]
                    if above is None:
                        node = TrieNode(prefix_id, None, 0, cumulative, cumulative, 0.0, now)
                    else:
                        own = cumulative - above.tokens
                        node = TrieNode(
                            prefix_id, above.prefix_id, above.depth + 1, cumulative, own, 0.0, now
                        )
                    nodes[prefix_id] = above = node
            step: TrieNode | None = nodes[leaf]
            while step is not None:
                if step.stamp == now:
                    step.count += weight
                elif now > step.stamp:
                    step.count = step.count * self.decay_factor(now - step.stamp) + weight
                    step.stamp = now
                else:
                    step.count += weight * self.decay_factor(step.stamp - now)
                step = nodes[step.parent] if step.parent is not None else None

    def path(self, prefix_id: int) -> list[int]:
        """The chain of `prefix_id`, root first, as far up as the trie knows it; [] for an unknown id."""
        path: list[int] = []
        node = self._nodes.get(prefix_id)
        bound = 0 if node is None else node.depth
        while node is not None and len(path) <= bound:  # the bound guards against a cycle in bad data
            path.append(node.prefix_id)
            node = self._nodes.get(node.parent) if node.parent is not None else None
        path.reverse()
        return path

    def prune(self, now: float, min_count: float) -> int:
        """Forget every prefix whose decayed count at `now` is below `min_count`; returns how many. A
        child never outcounts its parent, so what remains is still closed under parents."""
        stale = [prefix_id for prefix_id in self._nodes if self.count(prefix_id, now) < min_count]
        for prefix_id in stale:
            del self._nodes[prefix_id]
        return len(stale)
