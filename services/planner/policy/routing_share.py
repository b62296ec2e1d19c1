"""Which prefixes one replica's traffic goes through, under the gateway's hash ring. Pure: no I/O.

The gateway routes a request by one element of its chain, the routing key: the element at `routing_depth`
(0 is the root), or the last one for a shorter chain. Depth 0 is the design's default (route by the root);
a deeper key spreads load when every request shares its first blocks (one system prompt for everyone).
"""

from __future__ import annotations

from collections.abc import Sequence

from warmplane.shared.hash_ring import HashRing


class RoutingShare:
    """The share of `ring` that `replica` serves.

    A prefix at depth `routing_depth` or deeper is in the share when the ring's owner of its ancestor at
    `routing_depth` is `replica`. A prefix above the routing depth carries traffic of many routing keys, so
    it is in every replica's share, and `weight_fraction` (the replica's ring weight over the total)
    estimates how much of its traffic the replica sees. Raises `ValueError` for a negative depth or a
    replica the ring does not hold.
    """

    def __init__(self, ring: HashRing, replica: str, routing_depth: int = 0) -> None:
        if routing_depth < 0:
            raise ValueError(f"routing_depth must not be negative, got {routing_depth}")
        if replica not in ring:
            raise ValueError(f"replica {replica!r} is not on the ring")
        self.ring = ring
        self.replica = replica
        self.routing_depth = routing_depth
        self.weight_fraction = ring.weights[replica] / sum(ring.weights.values())
        self._owned: dict[int, bool] = {}

    def owns_key(self, routing_key: int) -> bool:
        """Whether the ring sends requests keyed `routing_key` here (memoised: the ring is immutable)."""
        owned = self._owned.get(routing_key)
        if owned is None:
            owned = self._owned[routing_key] = self.ring.owner(routing_key) == self.replica
        return owned

    def owns(self, path: Sequence[int]) -> bool:
        """Whether the prefix whose chain (root first, ending at the prefix) is `path` is in the share."""
        if len(path) <= self.routing_depth:
            return True
        return self.owns_key(path[self.routing_depth])
