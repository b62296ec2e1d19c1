"""A bounded memory of chain nodes known to be stored, so their edges are not written again.

Why the path sweep (`pg_retention.sweep_paths`) never deletes a row holding a node some planner's cache
remembers. A node enters a cache only once the batch that wrote (or found) its path committed, and that
batch also counted the request that carried it under the request's leaf, a descendant of the node (or
the node itself), in `prefix_stats`. The sweep keeps every row holding a prefix with a retained
statistics row, and every row holding a node that another row anchors at; the leaf's row is kept, so by
induction up the chain is every row holding one of its ancestors. A cache forgets everything once its
oldest node was remembered `max_age_s` ago, so every node it holds came with a request counted at most
`max_age_s` plus the planner's lag behind event time ago: well inside the detail retention (the cut of
`prefix_stats` and of the path sweep), which settings require to be at least twice `max_age_s`. (A
planner ingesting events nearly a whole retention late counts them into buckets the next sweep moves out
of the detail; its cache may then outlive their rows.)

One narrow race remains: a request reusing a prefix that no request used for the whole retention, counted
in a batch committing while a sweep statement deletes that prefix's row. The batch's path insert is
`ON CONFLICT DO NOTHING` against the row being deleted, and the sweep's snapshot does not see the batch's
new statistics row, so the row goes while this cache remembers its nodes: requests below them write
paths anchored at nodes no row holds, until the cache forgets (at most `max_age_s`) and the next request
through them writes its chain again from the nearest node still stored.
"""

from __future__ import annotations

from collections.abc import Iterable

from warmplane.services.planner.core.ingest_batch import ScopedPrefix


class NodeCache(set[ScopedPrefix]):
    """At most `capacity` nodes, none remembered for longer than `max_age_s`: emptied whole when full
    or when its oldest node is older than that. A set, so membership is tested in C on the fold's hot
    path. Forgetting a node costs a redundant write (its chain from the nearest node still remembered),
    never a wrong count.

    Times are seconds on one monotonic clock, handed in by the caller (`now`)."""

    def __init__(self, capacity: int = 1_000_000, max_age_s: float = 3600.0) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if max_age_s <= 0:
            raise ValueError("max_age_s must be positive")
        super().__init__()
        self.capacity = capacity
        self.max_age_s = max_age_s
        self._oldest: float | None = None
        """When the oldest node held was remembered; None while empty."""

    def forget_expired(self, now: float) -> None:
        """Empty the cache if its oldest node was remembered more than `max_age_s` before `now`. Call
        before every fold that reads the cache, so no fold trusts a node older than the bound."""
        if self._oldest is not None and now - self._oldest > self.max_age_s:
            self.clear()

    def add_all(self, nodes: Iterable[ScopedPrefix], now: float) -> None:
        """Remember `nodes` as stored at `now`. Call only after the transaction that stored them committed."""
        self.forget_expired(now)
        self.update(nodes)
        if len(self) > self.capacity:
            self.clear()
        elif self and self._oldest is None:
            self._oldest = now

    def clear(self) -> None:
        super().clear()
        self._oldest = None
