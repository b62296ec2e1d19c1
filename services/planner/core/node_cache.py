"""A bounded memory of chain nodes known to be stored, so their edges are not written again."""

from __future__ import annotations

from collections.abc import Iterable

from warmplane.services.planner.core.ingest_batch import NodeKey


class NodeCache(set[NodeKey]):
    """At most `capacity` nodes; emptied whole when full. A set, so membership is tested in C on the
    fold's hot path. Forgetting a node costs one redundant no-op write, never a wrong count."""

    def __init__(self, capacity: int = 1_000_000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        super().__init__()
        self.capacity = capacity

    def add_all(self, nodes: Iterable[NodeKey]) -> None:
        """Remember `nodes` as stored. Call only after the transaction that stored them committed."""
        self.update(nodes)
        if len(self) > self.capacity:
            self.clear()
