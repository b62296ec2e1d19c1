"""Choosing a replica: consistent hashing of a prefix chain element with bounded load, ramp and failover.

`Router.route(model, key, now)` returns the replicas to try, in order: first the bounded-load pick of
`HashRing.pick` (the key's ring owner unless it carries more than `load_factor` times its share of the
requests in flight), then the rest of the key's preference order: the failover order on a connection
error. Loads are the requests in flight per replica, counted by `acquire` and `release`.

A replica that turned ready `age` seconds ago has weight `age / ramp_s`, at least `ramp_min_weight`,
rounded up to a twentieth so a ramp rebuilds a model's ring at most twenty times. Rings are cached by
their members and weights. The planner asks the same ring (`ring(model, now)`) what each replica serves.
Pure apart from the in-flight counts: callers pass `now` in Unix seconds.
"""

from __future__ import annotations

import math

from warmplane.services.gateway.membership import Membership, Replica
from warmplane.services.gateway.settings import RoutingSettings
from warmplane.shared.hash_ring import HashRing

_WEIGHT_STEPS = 20
_RING_CACHE = 64


class Router:
    def __init__(self, membership: Membership, settings: RoutingSettings) -> None:
        self.membership = membership
        self.settings = settings
        self.in_flight: dict[str, int] = {}
        self._rings: dict[tuple[tuple[str, float], ...], HashRing] = {}

    def weight(self, replica: Replica, now: float) -> float:
        """`replica`'s ring weight at `now`, in (0, 1]."""
        ramp = self.settings.ramp_s
        if ramp <= 0 or replica.ready_at <= 0:
            return 1.0
        share = max(self.settings.ramp_min_weight, min(1.0, (now - replica.ready_at) / ramp))
        return min(1.0, math.ceil(share * _WEIGHT_STEPS) / _WEIGHT_STEPS)

    def ring(self, model: str, now: float) -> tuple[HashRing, dict[str, Replica]]:
        """The ring over `model`'s ready replicas at `now`, and those replicas by name.

        Raises `LookupError` when none is ready."""
        replicas = {replica.name: replica for replica in self.membership.ready(model, now)}
        if not replicas:
            raise LookupError(f"no ready replica of {model!r}")
        members = tuple((name, self.weight(replica, now)) for name, replica in replicas.items())
        ring = self._rings.get(members)
        if ring is None:
            if len(self._rings) >= _RING_CACHE:
                self._rings.clear()
            ring = self._rings[members] = HashRing(
                dict(members), vnodes=self.settings.vnodes, load_factor=self.settings.load_factor
            )
        return ring, replicas

    def route(self, model: str, key: int, now: float) -> list[Replica]:
        """The replicas to try for a request of `model` keyed by `key` (a chain element), best first.

        Empty when no replica of `model` is ready."""
        try:
            ring, replicas = self.ring(model, now)
        except LookupError:
            return []
        first = ring.pick(key, self.in_flight)
        rest = [name for name in ring.preference(key) if name != first]
        return [replicas[first], *(replicas[name] for name in rest)]

    def acquire(self, replica: str) -> int:
        """Count one more request in flight on `replica`; its count now."""
        count = self.in_flight[replica] = self.in_flight.get(replica, 0) + 1
        return count

    def release(self, replica: str) -> int:
        """Count one request fewer in flight on `replica` (call once per `acquire`); its count now."""
        count = self.in_flight.get(replica, 0) - 1
        if count > 0:
            self.in_flight[replica] = count
        else:
            self.in_flight.pop(replica, None)
        return max(count, 0)
