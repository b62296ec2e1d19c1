"""A bounded memory of chain nodes known to be stored, so their edges are not written again."""

from __future__ import annotations

from collections.abc import Iterable

from warmplane.services.planner.core.ingest_batch import NodeKey


class NodeCache:
    """Two generations of at most `capacity // 2` nodes each; the older one is dropped when the newer
    fills. Forgetting a node costs one redundant no-op write, never a wrong count.
    """

    def __init__(self, capacity: int = 1_000_000) -> None:
        if capacity < 2:
            raise ValueError("capacity must be at least 2")
        self._half = capacity // 2
        self._young: set[NodeKey] = set()
        self._old: set[NodeKey] = set()

    def __contains__(self, node: object) -> bool:
        return node in self._young or node in self._old

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def add_all(self, nodes: Iterable[NodeKey]) -> None:
        """Remember `nodes` as stored. Call only after the transaction that stored them committed."""
        for node in nodes:
            self._young.add(node)
            if len(self._young) >= self._half:
                self._old = self._young
                self._young = set()
