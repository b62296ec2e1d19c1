"""The sorted points of a hash ring's members (`hash_ring.HashRing`), kept and derived rather than sorted
again. Pure: no I/O; deterministic (the caches change cost, never a result).

A member's points are `blake2b(name, index)` for index 0, 1, ...; a layout is every point of some
members at full weight, sorted by (point, name, index), with each point's owner and index. A ring
whose weights change (a ramp step) reuses its layout as it is (`HashRing` skips the points a weight
leaves out); one whose members change by a few (a replica ready, ejected or gone) derives its layout
from a kept one by dropping and merging points, in time linear in the points, with no sort and no
hashing of members seen before. With a thousand members of 128 points, a first layout took about
200 ms here, one member more or less about 5 ms, and a ramp step nothing.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from itertools import compress

_POINTS: dict[str, list[int]] = {}
"""Each member's points by index, as far as some layout needed them."""
_POINTS_KEPT = 65_536
_LAYOUTS: OrderedDict[tuple[tuple[str, ...], int], Layout] = OrderedDict()
_LAYOUT_POINTS_KEPT = 1_000_000
"""Layouts are kept, least recently used first out, while they hold at most this many points (about
60 MB): a gateway's models each keep theirs, up to eight rings of a thousand replicas."""
_DERIVE_AT_MOST = 16
"""Members added or dropped beyond which a layout is sorted afresh rather than derived."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Every point of some members at full weight, sorted: its position, owner and index among the
    owner's points."""

    points: list[int]
    owners: list[str]
    indexes: list[int]


def member_point(member: str, index: int) -> int:
    """Where `member`'s `index`-th point falls on the circle."""
    digest = hashlib.blake2b(f"{member}\x00{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def layout(names: tuple[str, ...], vnodes: int) -> Layout:
    """The layout of `names` (sorted, distinct) at `vnodes` points each."""
    key = (names, vnodes)
    found = _LAYOUTS.get(key)
    if found is not None:
        _LAYOUTS.move_to_end(key)
        return found
    wanted = set(names)
    near = min(
        (
            (len(wanted.symmetric_difference(kept_names)), kept_names)
            for kept_names, kept_vnodes in _LAYOUTS
            if kept_vnodes == vnodes
        ),
        default=None,
    )
    if near is not None and near[0] <= _DERIVE_AT_MOST:
        kept_names = near[1]
        made = _derived(
            _LAYOUTS[(kept_names, vnodes)], set(kept_names) - wanted, sorted(wanted - set(kept_names)), vnodes
        )
    else:
        made = _sorted(names, vnodes)
    _LAYOUTS[key] = made
    kept = sum(len(each.points) for each in _LAYOUTS.values())
    while kept > _LAYOUT_POINTS_KEPT and len(_LAYOUTS) > 1:
        kept -= len(_LAYOUTS.popitem(last=False)[1].points)
    return made


def clear() -> None:
    """Forget every kept point and layout (benchmarks measure a first build)."""
    _POINTS.clear()
    _LAYOUTS.clear()


def _member_points(member: str, count: int) -> list[int]:
    """`member`'s first `count` points."""
    known = _POINTS.get(member)
    if known is None or len(known) < count:
        if len(_POINTS) >= _POINTS_KEPT:
            _POINTS.clear()
        known = _POINTS[member] = [member_point(member, index) for index in range(count)]
    return known[:count]


def _sorted(names: tuple[str, ...], vnodes: int) -> Layout:
    # Sorted as single integers: the point, then the member's rank by name, then the point's index;
    # several times as fast as sorting tuples.
    index_bits = max(1, (vnodes - 1).bit_length())
    rank_bits = max(1, (len(names) - 1).bit_length())
    keyed = [
        (point << rank_bits | rank) << index_bits | index
        for rank, member in enumerate(names)
        for index, point in enumerate(_member_points(member, vnodes))
    ]
    keyed.sort()
    index_mask, rank_mask = (1 << index_bits) - 1, (1 << rank_bits) - 1
    return Layout(
        [entry >> (rank_bits + index_bits) for entry in keyed],
        [names[(entry >> index_bits) & rank_mask] for entry in keyed],
        [entry & index_mask for entry in keyed],
    )


def _derived(base: Layout, dropped: set[str], added: list[str], vnodes: int) -> Layout:
    """`base` without the points of `dropped` and with those of `added` merged in, in (point, name,
    index) order."""
    points, owners, indexes = base.points, base.owners, base.indexes
    if dropped:
        keep = [owner not in dropped for owner in owners]
        points, owners, indexes = (
            list(compress(points, keep)),
            list(compress(owners, keep)),
            list(compress(indexes, keep)),
        )
    if not added:
        return Layout(points, owners, indexes)
    new = sorted(
        (point, member, index)
        for member in added
        for index, point in enumerate(_member_points(member, vnodes))
    )
    merged = Layout([], [], [])
    done = 0
    for point, member, index in new:
        at = bisect.bisect_left(points, point, done)
        while at < len(points) and points[at] == point and owners[at] < member:
            at += 1
        merged.points.extend(points[done:at])
        merged.owners.extend(owners[done:at])
        merged.indexes.extend(indexes[done:at])
        merged.points.append(point)
        merged.owners.append(member)
        merged.indexes.append(index)
        done = at
    merged.points.extend(points[done:])
    merged.owners.extend(owners[done:])
    merged.indexes.extend(indexes[done:])
    return merged
