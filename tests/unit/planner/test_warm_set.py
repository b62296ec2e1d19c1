"""Warm-set selection: the budget, chain order, residency, routing share, gain ordering and budget tiers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmplane.services.planner.policy import (
    BudgetTier,
    PrefixTrie,
    RoutingShare,
    WarmBudget,
    kv_prefix_seconds,
    reuse_probability,
    select_warm_set,
)
from warmplane.shared.hash_ring import HashRing

RING = HashRing(["r0", "r1", "r2"])
BIG = WarmBudget(tokens=10**9)

# Requests as (branches, arrival); an id names its whole path, as chained hashes do.
requests = st.lists(
    st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=6), st.floats(0, 600)), min_size=1, max_size=40
)


def chain_of(branches: list[int]) -> list[int]:
    return [hash(tuple(branches[: depth + 1])) for depth in range(len(branches))]


def fed_trie(seen: list[tuple[list[int], float]]) -> PrefixTrie:
    trie = PrefixTrie(half_life_s=120)
    for branches, now in seen:
        chain = chain_of(branches)
        trie.observe(chain, [512 * (depth + 1) for depth in range(len(chain))], now)
    return trie


def test_the_hotter_chain_is_chosen_first_with_its_ancestors_first() -> None:
    trie = PrefixTrie(half_life_s=60)
    for second in range(10):
        trie.observe([1, 2, 3], [100, 200, 300], now=second)
    trie.observe([1, 4], [100, 200], now=9)
    share = RoutingShare(HashRing(["only"]), "only")
    items = select_warm_set(trie, 10, share=share, budget=WarmBudget(tokens=300), kv_capacity_tokens=10_000)
    assert [item.prefix_id for item in items] == [1, 2, 3]
    assert sum(item.cost_tokens for item in items) == 300
    assert items[0].reuse_probability >= items[-1].reuse_probability > 0


def test_an_unlikely_block_is_not_chosen_for_itself() -> None:
    trie = PrefixTrie(half_life_s=60)
    trie.observe([1, 2], [100, 200], now=0)
    share = RoutingShare(HashRing(["only"]), "only")
    kept = select_warm_set(
        trie, 3_600, share=share, budget=BIG, kv_capacity_tokens=10_000, min_reuse_probability=0.1
    )
    assert kept == []


def test_the_routing_depth_decides_the_share_below_a_shared_root() -> None:
    trie = PrefixTrie(half_life_s=60)
    for key in range(40):
        trie.observe([0, 1_000 + key, 2_000 + key], [512, 1024, 1536], now=0)
    share = RoutingShare(RING, "r1", routing_depth=1)
    items = select_warm_set(trie, 0, share=share, budget=BIG, kv_capacity_tokens=10**9, capacity_fraction=1)
    keys = {item.prefix_id for item in items if item.depth == 1}
    assert keys == {1_000 + key for key in range(40) if RING.owner(1_000 + key) == "r1"}
    assert items[0].prefix_id == 0  # the shared root comes with the first chain, before it


def test_a_budget_in_seconds_and_the_capacity_cap_both_bound_the_tokens() -> None:
    budget = WarmBudget(tokens=100_000, seconds=2, prefill_tokens_per_s=10_000)
    assert budget.token_limit(kv_capacity_tokens=1_000_000, capacity_fraction=0.5) == 20_000
    assert budget.token_limit(kv_capacity_tokens=30_000, capacity_fraction=0.5) == 15_000
    with pytest.raises(ValueError, match="prefill rate"):
        WarmBudget(tokens=1, seconds=1)
    with pytest.raises(ValueError, match="capacity_fraction"):
        BIG.token_limit(1, 1.5)


def test_the_kv_tier_gets_what_the_weights_leave_of_the_deadline() -> None:
    assert list(BudgetTier) == [BudgetTier.WEIGHTS, BudgetTier.KV_PREFIXES, BudgetTier.RESULT_CACHE]
    assert kv_prefix_seconds(deadline_s=120, weights_load_s=45) == 75
    assert kv_prefix_seconds(deadline_s=30, weights_load_s=45) == 0


def test_reuse_probability_is_a_probability_growing_with_rate_and_window() -> None:
    assert reuse_probability(0, 300) == 0
    assert reuse_probability(0.01, 60) < reuse_probability(0.01, 300) < reuse_probability(0.1, 300) < 1


def test_a_replica_off_the_ring_is_refused() -> None:
    with pytest.raises(ValueError, match="not on the ring"):
        RoutingShare(RING, "r9")


@settings(max_examples=150, deadline=None)
@given(
    requests,
    st.integers(0, 20_000),
    st.floats(0, 1),
    st.sampled_from(["r0", "r1", "r2"]),
    st.integers(0, 2),
    st.sets(st.integers(0, 3), max_size=2),
)
def test_choices_respect_budget_order_residency_and_share(  # noqa: PLR0917 (hypothesis passes positionally)
    seen: list[tuple[list[int], float]],
    budget_tokens: int,
    fraction: float,
    replica: str,
    depth: int,
    resident_branches: set[int],
) -> None:
    trie = fed_trie(seen)
    resident = {chain_of([branch])[0] for branch in resident_branches}
    share = RoutingShare(RING, replica, routing_depth=depth)
    budget = WarmBudget(tokens=budget_tokens)
    items = select_warm_set(
        trie,
        600,
        share=share,
        budget=budget,
        kv_capacity_tokens=30_000,
        capacity_fraction=fraction,
        resident=resident,
    )
    assert sum(item.cost_tokens for item in items) <= budget.token_limit(30_000, fraction)
    listed: set[int] = set()
    for item in items:
        node = trie.node(item.prefix_id)
        assert node is not None
        assert node.parent is None or node.parent in listed or node.parent in resident
        assert item.prefix_id not in resident and item.prefix_id not in listed
        assert share.owns(trie.path(item.prefix_id))
        listed.add(item.prefix_id)
