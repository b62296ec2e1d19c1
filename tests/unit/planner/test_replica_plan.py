"""A replica's warm set from stored counts: decay folded per leaf, the ring share, the budget, residency,
renderable prefixes; properties over random tries."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmplane.services.planner.policy import (
    LeafCount,
    PolicyKnobs,
    PrefixTrie,
    RingSpec,
    StoredPrefix,
    WarmBudget,
    choose_for_replica,
    reuse_probability,
    trie_from_counts,
)
from warmplane.shared.hash_ring import HashRing

KNOBS = PolicyKnobs(half_life_s=60, ramp_window_s=300, min_reuse_probability=0.0, capacity_fraction=0.5)


def test_bucketed_counts_give_the_trie_that_observing_each_request_gives() -> None:
    prefixes = [StoredPrefix(1, None, 100), StoredPrefix(2, 1, 250), StoredPrefix(3, 1, 180)]
    counts = [LeafCount(2, 10.0, 4), LeafCount(2, 70.0, 1), LeafCount(3, 40.0, 2)]
    trie, left_out = trie_from_counts(prefixes, counts, 100.0, 60.0)
    one_by_one = PrefixTrie(60.0)
    for count in counts:
        chain, tokens = ([1, 2], [100, 250]) if count.leaf == 2 else ([1, 3], [100, 180])
        for _ in range(count.requests):
            one_by_one.observe(chain, tokens, count.at_s)
    assert left_out == 0
    for prefix in (1, 2, 3):
        assert math.isclose(trie.count(prefix, 100.0), one_by_one.count(prefix, 100.0))
    node = trie.node(2)
    assert node is not None and (node.parent, node.tokens, node.own_tokens) == (1, 250, 150)


def test_leaves_with_unknown_chains_or_untokened_roots_are_left_out_and_counted() -> None:
    prefixes = [
        StoredPrefix(1, None, 100),
        StoredPrefix(4, 5, 10),
        StoredPrefix(5, 4, 9),
        StoredPrefix(6, None, 0),
    ]
    counts = [LeafCount(9, 0.0, 1), LeafCount(5, 0.0, 1), LeafCount(6, 0.0, 1), LeafCount(1, 0.0, 3)]
    trie, left_out = trie_from_counts(prefixes, counts, 0.0, 60.0)
    assert left_out == 3  # 9 is unknown, 5's chain loops, 6 has no tokens
    assert [node.prefix_id for node in trie.nodes()] == [1]
    assert trie.count(1, 0.0) == 3


def test_a_prefix_recorded_with_fewer_tokens_than_its_parent_counts_at_its_parents() -> None:
    """The gateway scales each request's token estimate to its prompt count, so a chain stored from two
    requests may dip (3 recorded below 2): its leaves still count, the dip read as no tokens of its own,
    and a prefix below it keeps its own tokens."""
    prefixes = [
        StoredPrefix(1, None, 100),
        StoredPrefix(2, 1, 230),
        StoredPrefix(3, 2, 226),
        StoredPrefix(4, 3, 300),
    ]
    counts = [LeafCount(3, 0.0, 2), LeafCount(4, 0.0, 1)]
    trie, left_out = trie_from_counts(prefixes, counts, 0.0, 60.0)
    assert left_out == 0
    assert trie.count(1, 0.0) == trie.count(2, 0.0) == trie.count(3, 0.0) == 3
    shape = [(n.prefix_id, n.tokens, n.own_tokens) for n in trie.nodes()]
    assert shape == [(1, 100, 100), (2, 230, 130), (3, 230, 0), (4, 300, 70)]


def test_a_frequency_half_life_makes_each_rate_the_mean_of_the_two_estimates() -> None:
    prefixes = [StoredPrefix(1, None, 100), StoredPrefix(2, 1, 250), StoredPrefix(3, None, 80)]
    # 2: used often, long ago (a shared document); 3: used once, just now (a resumed conversation).
    counts = [LeafCount(2, 0.0, 30), LeafCount(3, 1_190.0, 1)]
    blended, left_out = trie_from_counts(prefixes, counts, 1_200.0, 60.0, 600.0)
    fast, _ = trie_from_counts(prefixes, counts, 1_200.0, 60.0)
    slow, _ = trie_from_counts(prefixes, counts, 1_200.0, 600.0)
    assert left_out == 0
    for prefix in (1, 2, 3):
        mean = (fast.rate(prefix, 1_200.0) + slow.rate(prefix, 1_200.0)) / 2
        assert math.isclose(blended.rate(prefix, 1_200.0), mean)
    # Recency alone writes the document off, frequency alone the conversation; blended, both are likely
    # enough to be reused in a 300 s ramp to be warmed (the least probability is 0.3).
    assert reuse_probability(fast.rate(2, 1_200.0), 300) < 0.01
    assert reuse_probability(slow.rate(3, 1_200.0), 300) < 0.3
    assert min(reuse_probability(blended.rate(p, 1_200.0), 300) for p in (2, 3)) > 0.5


def test_a_frequency_half_life_must_be_the_longer_one() -> None:
    with pytest.raises(ValueError, match="must be shorter than"):
        trie_from_counts([StoredPrefix(1, None, 10)], [LeafCount(1, 0.0, 1)], 0.0, 600.0, 60.0)


def test_a_count_decayed_to_nothing_is_gone_not_left_out() -> None:
    # A day of 60 s half-lives: 2 ** -1440 is 0.0 in floating point.
    trie, left_out = trie_from_counts([StoredPrefix(1, None, 10)], [LeafCount(1, 0.0, 5)], 86_400.0, 60.0)
    assert (left_out, len(trie)) == (0, 0)
    blended, left_out = trie_from_counts(
        [StoredPrefix(1, None, 10)], [LeafCount(1, 0.0, 5)], 86_400.0, 60.0, 6_000.0
    )
    assert left_out == 0 and blended.rate(1, 86_400.0) > 0  # the frequency estimate remembers it


def test_an_unknown_capacity_leaves_the_budget_alone_and_a_known_one_caps_it() -> None:
    trie, _ = trie_from_counts([StoredPrefix(1, None, 1_000)], [LeafCount(1, 0.0, 5)], 0.0, 60.0)
    common = {"replica": "r", "members": ["r"], "ring": RingSpec(), "budget": WarmBudget(800), "knobs": KNOBS}
    items, limit = choose_for_replica(trie, 0.0, kv_capacity_tokens=None, **common)  # type: ignore[arg-type]
    assert (items, limit) == ([], 800)  # 1,000 tokens do not fit 800
    items, limit = choose_for_replica(trie, 0.0, kv_capacity_tokens=1_000, **common)  # type: ignore[arg-type]
    assert (items, limit) == ([], 500)
    seconds = WarmBudget(5_000, seconds=2.0, prefill_tokens_per_s=600.0)
    common["budget"] = seconds
    items, limit = choose_for_replica(trie, 0.0, kv_capacity_tokens=None, **common)  # type: ignore[arg-type]
    assert limit == 1_200 and [item.prefix_id for item in items] == [1]


def test_only_renderable_prefixes_are_chosen_for_themselves_and_bring_their_ancestors() -> None:
    prefixes = [StoredPrefix(1, None, 100), StoredPrefix(2, 1, 200), StoredPrefix(3, 1, 150)]
    trie, _ = trie_from_counts(prefixes, [LeafCount(2, 0.0, 1), LeafCount(3, 0.0, 8)], 0.0, 60.0)
    items, _ = choose_for_replica(
        trie, 0.0, replica="r", members=[], ring=RingSpec(), budget=WarmBudget(10_000),
        kv_capacity_tokens=None, knobs=KNOBS, renderable={2},
    )  # fmt: skip
    assert [item.prefix_id for item in items] == [1, 2]  # 3 is hotter but nothing renders it


# Random tries: a prefix id names its path of branch choices, so random paths share ancestors.
paths = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=30)


def stored(choices: list[list[int]]) -> tuple[list[StoredPrefix], list[LeafCount]]:
    prefixes: dict[int, StoredPrefix] = {}
    counts = []
    for n, path in enumerate(choices):
        parent = None
        for depth in range(len(path)):
            prefix = hash(tuple(path[: depth + 1])) & 0xFFFFFFFF
            prefixes.setdefault(prefix, StoredPrefix(prefix, parent, 64 * (depth + 1)))
            parent = prefix
        counts.append(LeafCount(parent or 0, float(n * 7 % 300), 1 + n % 4))
    # Tokens grow down a chain: each block adds 64 to its parent's (a prefix keeps its first parent).
    fixed: dict[int, StoredPrefix] = {}
    for node in prefixes.values():
        above = fixed.get(node.parent) if node.parent is not None else None
        fixed[node.prefix_id] = StoredPrefix(node.prefix_id, node.parent, (above.tokens if above else 0) + 64)
    return list(fixed.values()), counts


@settings(max_examples=200, deadline=None)
@given(
    choices=paths,
    budget=st.integers(0, 2_000),
    capacity=st.one_of(st.none(), st.integers(0, 4_000)),
    members=st.lists(st.sampled_from(["a", "b", "c"]), max_size=3),
    depth=st.integers(0, 2),
    resident_picks=st.lists(st.integers(0, 10**6), max_size=5),
    renderable_picks=st.lists(st.integers(0, 10**6), max_size=20),
    max_items=st.one_of(st.none(), st.integers(0, 6)),
)
def test_warm_sets_keep_the_budget_the_chain_order_the_share_and_skip_what_is_held(
    *,
    choices: list[list[int]],
    budget: int,
    capacity: int | None,
    members: list[str],
    depth: int,
    resident_picks: list[int],
    renderable_picks: list[int],
    max_items: int | None,
) -> None:
    prefixes, counts = stored(choices)
    trie, left_out = trie_from_counts(prefixes, counts, 300.0, 60.0)
    assert left_out == 0
    ids = [p.prefix_id for p in prefixes]
    resident = {ids[i % len(ids)] for i in resident_picks}
    # A replica holds whole chains (a warm prefix's ancestors are warm), so close residency upwards.
    for prefix in list(resident):
        resident.update(trie.path(prefix))
    renderable = {ids[i % len(ids)] for i in renderable_picks}
    ring = RingSpec(depth=depth)
    items, limit = choose_for_replica(
        trie, 300.0, replica="new", members=members, ring=ring, budget=WarmBudget(budget),
        kv_capacity_tokens=capacity, knobs=KNOBS, resident=resident, renderable=renderable,
        max_items=max_items,
    )  # fmt: skip
    assert sum(item.cost_tokens for item in items) <= limit <= budget
    seen: set[int] = set()
    hash_ring = HashRing(sorted({*members, "new"}))
    for item in items:
        node = trie.node(item.prefix_id)
        assert node is not None
        assert item.prefix_id not in resident and item.prefix_id not in seen
        assert node.parent is None or node.parent in seen or node.parent in resident
        path = trie.path(item.prefix_id)
        assert len(path) <= depth or hash_ring.owner(path[depth]) == "new"
        seen.add(item.prefix_id)
    # Every item is renderable or an ancestor of a chosen renderable one.
    chosen_renderable = [i.prefix_id for i in items if i.prefix_id in renderable]
    ancestors = {a for prefix in chosen_renderable for a in trie.path(prefix)}
    assert seen <= ancestors
    if max_items is not None:
        assert len(chosen_renderable) <= max_items


def test_spread_plans_every_replica_for_its_share_of_every_prefix() -> None:
    """A router that is not the ring: each replica gets the fleet's hot prefixes, whoever the ring's owner,
    each scored at the replica's weight share of its traffic."""
    roots = list(range(1, 41))
    prefixes = [StoredPrefix(root, None, 64) for root in roots]
    counts = [LeafCount(root, 290.0, 3) for root in roots]
    trie, _ = trie_from_counts(prefixes, counts, 300.0, 60.0)
    members = ["a", "b", "c"]
    common = {"members": members, "budget": WarmBudget(10_000), "kv_capacity_tokens": None, "knobs": KNOBS}
    by_ring = {
        replica: choose_for_replica(trie, 300.0, replica=replica, ring=RingSpec(), **common)[0]  # type: ignore[arg-type]
        for replica in members
    }
    spread = {
        replica: choose_for_replica(trie, 300.0, replica=replica, ring=RingSpec(spread=True), **common)[0]  # type: ignore[arg-type]
        for replica in members
    }
    # The ring splits the roots between the replicas; spread gives each of them every root.
    assert sorted(i.prefix_id for items in by_ring.values() for i in items) == roots
    for items in spread.values():
        assert sorted(item.prefix_id for item in items) == roots
    rate = trie.rate(1, 300.0)
    [owner] = [replica for replica, items in by_ring.items() if any(i.prefix_id == 1 for i in items)]
    owned = next(i for i in by_ring[owner] if i.prefix_id == 1)
    shared = next(i for i in spread[owner] if i.prefix_id == 1)
    assert math.isclose(owned.reuse_probability, reuse_probability(rate, 300.0))
    assert math.isclose(shared.reuse_probability, reuse_probability(rate / 3, 300.0))
