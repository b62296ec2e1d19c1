"""The ring the gateway routes with and the planner plans with: balance, stability, bounded load, ramp-in."""

from __future__ import annotations

import bisect
import hashlib
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmplane.shared import ring_layout
from warmplane.shared.hash_ring import HashRing, key_point

_RNG = random.Random(7)
KEYS = [_RNG.getrandbits(64) - 2**63 for _ in range(20_000)]


def test_keys_spread_evenly_over_equal_members() -> None:
    ring = HashRing([f"r{i}" for i in range(4)])
    shares = Counter(ring.owner(key) for key in KEYS)
    assert set(shares) == {"r0", "r1", "r2", "r3"}
    assert max(shares.values()) / min(shares.values()) < 1.35  # 128 points each


def test_adding_a_member_moves_only_the_keys_it_takes() -> None:
    before = HashRing(["r0", "r1", "r2"])
    after = HashRing(["r0", "r1", "r2", "r3"])
    moved = [key for key in KEYS if before.owner(key) != after.owner(key)]
    assert all(after.owner(key) == "r3" for key in moved)
    assert 0.15 < len(moved) / len(KEYS) < 0.35  # about a quarter


def test_removing_a_member_moves_only_its_keys_and_to_their_next_preference() -> None:
    full = HashRing(["r0", "r1", "r2", "r3"])
    without = HashRing(["r0", "r1", "r3"])
    for key in KEYS[:2_000]:
        order = [member for member in full.preference(key) if member != "r2"]
        assert without.owner(key) == order[0]


def test_the_preference_order_names_every_member_once_starting_with_the_owner() -> None:
    ring = HashRing(["a", "b", "c"])
    for key in KEYS[:500]:
        order = list(ring.preference(key))
        assert sorted(order) == ["a", "b", "c"] and order[0] == ring.owner(key)


def test_a_ramping_member_owns_keys_in_proportion_to_its_weight() -> None:
    ring = HashRing({"old-0": 1.0, "old-1": 1.0, "new": 0.25})
    share = sum(ring.owner(key) == "new" for key in KEYS) / len(KEYS)
    assert 0.07 < share < 0.16  # 0.25 / 2.25 = 0.11


def test_bytes_and_ints_are_keys_and_the_same_key_always_lands_alike() -> None:
    ring = HashRing(["a", "b"])
    assert ring.owner(b"tenant/model/1") == HashRing(["b", "a"]).owner(b"tenant/model/1")
    assert key_point(5) != key_point(6)


@settings(max_examples=200)
@given(
    members=st.integers(1, 6),
    load_factor=st.sampled_from([1.0, 1.25, 2.0]),
    keys=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=300),
)
def test_no_member_goes_over_its_bound(members: int, load_factor: float, keys: list[int]) -> None:
    ring = HashRing([f"r{i}" for i in range(members)], load_factor=load_factor)
    loads: Counter[str] = Counter()
    hot = keys[0]
    for key in [hot] * len(keys) + keys:  # one hot prefix, then the rest
        member = ring.pick(key, loads)
        loads[member] += 1
        total = sum(loads.values())
        assert loads[member] <= ring.capacity(member, total)


def test_with_no_load_pick_is_the_owner() -> None:
    ring = HashRing(["a", "b", "c"])
    assert all(ring.pick(key, {}) == ring.owner(key) for key in KEYS[:1_000])


@pytest.mark.parametrize(
    ("members", "message"),
    [({"a": 0.0}, "weight"), ({"a": 1.5}, "weight")],
)
def test_bad_weights_are_refused(members: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HashRing(members)


def test_an_empty_ring_says_so() -> None:
    with pytest.raises(LookupError, match="no members"):
        HashRing([]).owner(1)


def member_point(member: str, index: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{member}\x00{index}".encode(), digest_size=8).digest(), "big")


def reference_preference(weights: dict[str, float], vnodes: int, key: int) -> list[str]:
    """The ring by its definition: each member's first `round(vnodes * weight)` points (at least one),
    sorted with their names; from the key's point on around, each member once."""
    points = sorted(
        (member_point(member, index), member)
        for member, weight in weights.items()
        for index in range(max(1, round(vnodes * weight)))
    )
    start = bisect.bisect_left([point for point, _ in points], key_point(key))
    order: list[str] = []
    for step in range(len(points)):
        member = points[(start + step) % len(points)][1]
        if member not in order:
            order.append(member)
    return order


@settings(max_examples=150, deadline=None)
@given(
    weights=st.dictionaries(
        st.text("abcdef", min_size=1, max_size=3),
        st.sampled_from([0.05, 0.1, 0.55, 0.9, 1.0]),
        min_size=1,
        max_size=8,
    ),
    vnodes=st.sampled_from([1, 3, 16, 128]),
    keys=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=20),
)
def test_every_ring_orders_members_as_its_definition_says(
    weights: dict[str, float], vnodes: int, keys: list[int]
) -> None:
    """Rings share their sorted points across weights (a ramp re-weights without sorting again), and
    with members' points cached: neither changes an order."""
    ring = HashRing(weights, vnodes=vnodes)
    full = HashRing(dict.fromkeys(weights, 1.0), vnodes=vnodes)  # the same layout, no member held back
    for key in keys:
        assert list(ring.preference(key)) == reference_preference(weights, vnodes, key)
        assert list(full.preference(key)) == reference_preference(dict.fromkeys(weights, 1.0), vnodes, key)


@settings(max_examples=60, deadline=None)
@given(
    first=st.sets(st.text("abcdefgh", min_size=1, max_size=2), min_size=1, max_size=12),
    changes=st.lists(
        st.tuples(st.booleans(), st.text("abcdefgh", min_size=1, max_size=2)), min_size=1, max_size=6
    ),
    vnodes=st.sampled_from([1, 8, 64]),
)
def test_a_ring_whose_members_change_by_a_few_orders_them_as_its_definition_says(
    first: set[str], changes: list[tuple[bool, str]], vnodes: int
) -> None:
    """Members joining and leaving one by one, as ready and ejected replicas do: each ring's points
    are derived from the last one's, and must still order members by the definition."""
    ring_layout.clear()
    members = set(first)
    for join, member in changes:
        if join:
            members.add(member)
        elif len(members) > 1:
            members.discard(member)
        ring = HashRing(members, vnodes=vnodes)
        for key in KEYS[:25]:
            assert list(ring.preference(key)) == reference_preference(
                dict.fromkeys(members, 1.0), vnodes, key
            )
