"""A bounded memory of chain nodes known to be stored, so their edges are not written again.

Why the chain sweep (`pg_retention.sweep_chains`, by age alone) never deletes a row a planner will anchor
at, nor one a retained count reaches. A node enters a cache only once the batch that wrote it committed,
and a cache forgets everything at once, when its oldest node was remembered `max_age_s` ago (or when it is
full). So at any fold everything it holds was written within `max_age_s`, and with it every ancestor of
what it holds: a node was cached with its ancestors (written in its batch, or cached before it, in the
same life of the cache). A batch anchors its new nodes at cached ones only, so the whole chain of a
request counted at time t lies in rows written within `max_age_s` before t's commit. The sweep keeps rows
for twice `max_age_s` before the detail cut of the counts (for the planner's lag behind event time and
the clocks of two hosts), and settings require the detail retention to be at least twice `max_age_s`.
(A planner ingesting events nearly a whole retention late counts them into buckets the next sweep moves
out of the detail; their chains may then be gone first, and their leaves are left out of a plan's trie.)
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Set

from warmplane.services.planner.core.ingest_batch import Scope, ScopedPrefix


class NodeCache:
    """At most `capacity` nodes, none remembered for longer than `max_age_s`: emptied whole when full
    or when its oldest node is older than that. Forgetting a node costs a redundant write (its chain from
    the nearest node still remembered), never a wrong count.

    Held as a set of prefix ids per scope (`by_scope`, what a fold reads): the fold's walk up a chain then
    tests plain ints in C, where a (scope, prefix) tuple was built and hashed for every node it passed:
    on chat-shaped traffic that was most of the fold (`python -m bench.fold_bench` measures it).

    Times are seconds on one monotonic clock, handed in by the caller (`now`)."""

    def __init__(self, capacity: int = 1_000_000, max_age_s: float = 3600.0) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if max_age_s <= 0:
            raise ValueError("max_age_s must be positive")
        self.capacity = capacity
        self.max_age_s = max_age_s
        self._by_scope: dict[Scope, set[int]] = {}
        self._size = 0
        self._oldest: float | None = None
        """When the oldest node held was remembered; None while empty."""

    @property
    def by_scope(self) -> Mapping[Scope, Set[int]]:
        """The nodes remembered, by scope: what `ingest_batch.fold_events` reads."""
        return self._by_scope

    def __len__(self) -> int:
        return self._size

    def __contains__(self, node: ScopedPrefix) -> bool:
        return node[1] in self._by_scope.get(node[0], ())

    def __iter__(self) -> Iterator[ScopedPrefix]:
        return ((scope, prefix) for scope, prefixes in self._by_scope.items() for prefix in prefixes)

    def forget_expired(self, now: float) -> None:
        """Empty the cache if its oldest node was remembered more than `max_age_s` before `now`. Call
        before every fold that reads the cache, so no fold trusts a node older than the bound."""
        if self._oldest is not None and now - self._oldest > self.max_age_s:
            self.clear()

    def add_all(self, nodes: Mapping[Scope, Collection[int]], now: float) -> None:
        """Remember `nodes` (prefix ids by scope) as stored at `now`. Call only after the transaction that
        stored them committed."""
        self.forget_expired(now)
        for scope, prefixes in nodes.items():
            held = self._by_scope.get(scope)
            if held is None:
                held = self._by_scope[scope] = set()
            before = len(held)
            held.update(prefixes)
            self._size += len(held) - before
        if self._size > self.capacity:
            self.clear()
        elif self._size and self._oldest is None:
            self._oldest = now

    def clear(self) -> None:
        self._by_scope.clear()
        self._size = 0
        self._oldest = None
