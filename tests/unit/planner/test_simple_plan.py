"""The simple warm-set policy: budget, catalogue, order, and the deepest prefix of an equal-count run."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from warmplane.services.planner.policy.replica_plan import NodeKey
from warmplane.services.planner.trace_eval.simple_plan import (
    Candidate,
    PrefixNode,
    choose_warm_set,
    requests_through,
)


def chain(scope: int, ids: list[int], tokens_each: int = 100) -> list[PrefixNode]:
    nodes, parent = [], None
    for depth, prefix in enumerate(ids):
        key = (scope, prefix)
        nodes.append(PrefixNode(key, parent, depth, tokens_each * (depth + 1)))
        parent = key
    return nodes


def candidates(
    nodes: list[PrefixNode], leaves: Mapping[NodeKey, int], catalogued: set[NodeKey]
) -> list[Candidate]:
    through = requests_through(nodes, leaves)
    return [Candidate(n, through[n.key], n.key in catalogued) for n in nodes if n.key in through]


@st.composite
def forests(draw: st.DrawFn) -> tuple[list[PrefixNode], dict[NodeKey, int], set[NodeKey]]:
    """A random trie over two scopes, with leaf counts and a random catalogue."""
    size = draw(st.integers(1, 40))
    nodes: list[PrefixNode] = []
    for index in range(size):
        scope = draw(st.sampled_from([1, 2]))
        same_scope = [n for n in nodes if n.key[0] == scope]
        parent = draw(st.none() | st.sampled_from(same_scope)) if same_scope else None
        step = draw(st.integers(0, 500))
        depth, tokens = (parent.depth + 1, parent.tokens + step) if parent else (0, step)
        nodes.append(PrefixNode((scope, index), parent.key if parent else None, depth, tokens))
    leaves = {n.key: draw(st.integers(0, 50)) for n in nodes if draw(st.booleans())}
    catalogued = {n.key for n in nodes if draw(st.booleans())}
    return nodes, leaves, catalogued


@settings(max_examples=300, deadline=None)
@given(forests(), st.integers(0, 3_000), st.integers(0, 10))
def test_a_plan_fits_its_budget_and_holds_only_catalogued_prefixes_in_trie_order(
    forest: tuple[list[PrefixNode], dict[NodeKey, int], set[NodeKey]], budget: int, max_items: int
) -> None:
    nodes, leaves, catalogued = forest
    chosen = choose_warm_set(candidates(nodes, leaves, catalogued), budget_tokens=budget, max_items=max_items)
    assert sum(c.node.tokens for c in chosen) <= budget
    assert len(chosen) <= max_items
    assert all(c.catalogued and c.node.key in catalogued and c.requests > 0 for c in chosen)
    assert len({c.node.key for c in chosen}) == len(chosen)
    parents = {n.key: n.parent for n in nodes}
    position = {c.node.key: i for i, c in enumerate(chosen)}
    for c in chosen:
        ancestor = c.node.parent
        while ancestor is not None:
            assert position.get(ancestor, -1) < position[c.node.key]
            # The deepest of an equal-count run is taken, never also an ancestor it covers.
            if ancestor in position:
                assert chosen[position[ancestor]].requests > c.requests
            ancestor = parents[ancestor]


@settings(max_examples=200, deadline=None)
@given(forests())
def test_requests_through_a_prefix_sum_its_subtree(
    forest: tuple[list[PrefixNode], dict[NodeKey, int], set[NodeKey]],
) -> None:
    nodes, leaves, _ = forest
    through = requests_through(nodes, leaves)
    children: dict[NodeKey, list[NodeKey]] = {}
    for n in nodes:
        if n.parent is not None:
            children.setdefault(n.parent, []).append(n.key)
    for n in nodes:
        below = sum(through.get(child, 0) for child in children.get(n.key, []))
        assert through.get(n.key, 0) == leaves.get(n.key, 0) + below
    assert sum(through.get(n.key, 0) for n in nodes if n.parent is None) == sum(leaves.values())


def test_the_deepest_catalogued_prefix_of_an_equal_count_run_wins() -> None:
    nodes = chain(1, [1, 2, 3])
    plan = choose_warm_set(
        candidates(nodes, {(1, 3): 10}, {(1, 1), (1, 2)}), budget_tokens=10_000, max_items=10
    )
    assert [c.node.key for c in plan] == [(1, 2)]


def test_an_ancestor_is_chosen_only_while_its_chosen_branches_leave_traffic_uncovered() -> None:
    nodes = [*chain(1, [1, 4]), *chain(1, [1, 2, 3])[1:]]
    everything = {n.key for n in nodes}
    offered = candidates(nodes, {(1, 4): 8, (1, 3): 5}, everything)
    # Values: 4 -> 1600 (200 tokens), 3 -> 1500 (300), 1 -> 1300 (100, 13 requests), 2 -> 1000 (200).
    plan = choose_warm_set(offered, budget_tokens=400, max_items=10)
    assert [c.node.key for c in plan] == [(1, 1), (1, 4)]
    plan = choose_warm_set(offered, budget_tokens=600, max_items=10)
    assert [c.node.key for c in plan] == [(1, 4), (1, 3)]  # 8 + 5 requests: all of prefix 1's


def test_a_prefix_too_large_for_what_is_left_is_skipped_for_smaller_ones() -> None:
    nodes = [*chain(1, [1, 2, 3]), *chain(2, [9])]
    plan = choose_warm_set(
        candidates(nodes, {(1, 3): 10, (2, 9): 1}, {(1, 3), (2, 9)}), budget_tokens=250, max_items=10
    )
    assert [c.node.key for c in plan] == [(2, 9)]


def test_max_items_keeps_the_most_valuable() -> None:
    nodes = [*chain(1, [1]), *chain(1, [2]), *chain(1, [3])]
    plan = choose_warm_set(
        candidates(nodes, {(1, 1): 1, (1, 2): 3, (1, 3): 2}, {(1, 1), (1, 2), (1, 3)}),
        budget_tokens=10_000,
        max_items=2,
    )
    assert [c.node.key for c in plan] == [(1, 2), (1, 3)]
