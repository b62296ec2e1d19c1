"""Consistent hashing with bounded loads: which replica a prefix goes to. Pure: no I/O, deterministic.

The gateway routes a request by the root of its prefix chain with this ring, and the planner asks the
same ring which prefixes each replica will be sent (design brief, section 6), so both must build it from
the same members with the same settings.

- Each member owns `vnodes * weight` points on a 64-bit circle (at least one while its weight is
  positive); a key goes to the owner of the first point at or after the key's own point. Adding or
  removing a member moves only the keys it gains or loses (about 1/n of them).
- A weight in (0, 1] ramps a new member in: it owns fewer points, so fewer keys, until it is raised to 1.
- Bounded load (Mirrokni, Thorup and Zadimoghaddam, 2018): `pick` walks the key's preference order and
  skips members whose load would exceed `load_factor` times their weighted share of the total, so a hot
  prefix spills to the next member on the ring instead of overloading one; with equal loads it is the
  plain consistent-hash owner.
- Keys are prefix ids (signed 64-bit integers, already hashes) or any bytes; both are mixed again so
  that sequential ids spread too.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Final

from warmplane.shared.ring_layout import layout

_MASK = (1 << 64) - 1
DEFAULT_VNODES: Final = 128
DEFAULT_LOAD_FACTOR: Final = 1.25


def _mix(value: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers that spreads nearby values."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def key_point(key: int | bytes) -> int:
    """Where `key` (a prefix id, or bytes) falls on the circle."""
    if isinstance(key, bytes):
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
    return _mix(key & _MASK)


class HashRing:
    """An immutable ring over `members` (names, or names with weights in (0, 1]).

    Raises `ValueError` for a weight outside (0, 1], a non-positive `vnodes` or a `load_factor` below 1.
    """

    def __init__(
        self,
        members: Mapping[str, float] | Iterable[str],
        *,
        vnodes: int = DEFAULT_VNODES,
        load_factor: float = DEFAULT_LOAD_FACTOR,
    ) -> None:
        weights = dict(members) if isinstance(members, Mapping) else dict.fromkeys(members, 1.0)
        if vnodes < 1:
            raise ValueError(f"vnodes must be positive, got {vnodes}")
        if load_factor < 1:
            raise ValueError(f"load_factor must be at least 1, got {load_factor}")
        for member, weight in weights.items():
            if not 0 < weight <= 1:
                raise ValueError(f"weight of {member!r} must be in (0, 1], got {weight}")
        self.weights: dict[str, float] = weights
        self._total_weight = sum(weights.values())
        self.vnodes = vnodes
        self.load_factor = load_factor
        points = layout(tuple(sorted(weights)), vnodes)
        self._points, self._owners, self._indexes = points.points, points.owners, points.indexes
        # A member below full weight owns its first `round(vnodes * weight)` points (at least one):
        # the layout holds every member's points at full weight, and lookups skip the others. So a
        # ring whose weights step up (a ramp) shares its sorted points with the last one.
        self._limits = {
            member: limit
            for member, weight in weights.items()
            if (limit := max(1, round(vnodes * weight))) < vnodes
        }

    def __len__(self) -> int:
        return len(self.weights)

    def __contains__(self, member: object) -> bool:
        return member in self.weights

    def owner(self, key: int | bytes) -> str:
        """The member `key` goes to when loads do not matter. Raises `LookupError` on an empty ring."""
        return next(self.preference(key))

    def preference(self, key: int | bytes) -> Iterator[str]:
        """Every member once, in the order `key` tries them: its owner first, then on around the ring
        (the failover order). Raises `LookupError` (on first use) for an empty ring."""
        if not self._points:
            raise LookupError("the ring has no members")
        start = bisect.bisect_left(self._points, key_point(key))
        owners, indexes, limits = self._owners, self._indexes, self._limits
        seen: set[str] = set()
        count = len(self._points)
        for step in range(count):
            at = (start + step) % count
            member = owners[at]
            if member in seen or (limits and indexes[at] >= limits.get(member, count)):
                continue
            seen.add(member)
            yield member
            if len(seen) == len(self.weights):
                return

    def capacity(self, member: str, total_load: int) -> int:
        """The most load `member` may carry when `total_load` (the new unit included) is spread."""
        share = self.weights[member] / self._total_weight
        return max(1, math.ceil(self.load_factor * total_load * share))

    def pick(self, key: int | bytes, loads: Mapping[str, int], *, total: int | None = None) -> str:
        """The member for one more unit of `key` given current `loads` (absent members count 0; members
        of other rings are not counted): the first in `preference(key)` still under its capacity. Raises
        `LookupError` on an empty ring. `total`, the members' loads summed, if the caller keeps it
        (the gateway's router does); else it is summed over the members `loads` names."""
        weights = self.weights
        if total is None:
            if len(loads) < len(weights):
                total = sum(load for member, load in loads.items() if member in weights)
            else:
                total = sum(loads.get(member, 0) for member in weights)
        total += 1
        for member in self.preference(key):
            if loads.get(member, 0) + 1 <= self.capacity(member, total):
                return member
        return self.owner(key)  # unreachable while load_factor >= 1: some member is at or under its share
