"""The ring the gateway routes with and the planner plans with: balance, stability, bounded load, ramp-in."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
