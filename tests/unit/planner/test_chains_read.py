"""A plan's read keeps the nodes on the counted leaves' chains, and at most `max_nodes` of them
(`core/chains_read.py`): checked against chains walked directly, on forests stored as ingestion stores them
(path rows anchored at nodes stored before)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from warmplane.services.planner.core.chains_read import ChainsNeeded
from warmplane.services.planner.policy import StoredPrefix

Row = tuple[int, int | None, list[int], list[int]]
"""(scope, anchor, ids, tokens), as `prefix_paths` holds a row."""


def stored_forest(seed: int, rows: int) -> tuple[list[Row], dict[tuple[int, int], StoredPrefix]]:
    """`rows` path rows, oldest first, in two scopes: each a run of new nodes under a root or under a node
    of an earlier row (a conversation's next turn, or a chat under a system prompt), and every node."""
    rng = random.Random(seed)
    nodes: dict[tuple[int, int], StoredPrefix] = {}
    paths: list[Row] = []
    next_id = 1
    for _ in range(rows):
        scope = rng.choice((1, 2))
        known = [key for key in nodes if key[0] == scope]
        anchor = rng.choice(known)[1] if known and rng.random() < 0.8 else None
        tokens = 0 if anchor is None else nodes[(scope, anchor)].tokens
        ids, cumulative, parent = [], [], anchor
        for _ in range(rng.randint(1, 5)):
            tokens += 16
            nodes[(scope, next_id)] = StoredPrefix(next_id, parent, tokens)
            ids.append(next_id)
            cumulative.append(tokens)
            parent, next_id = next_id, next_id + 1
        paths.append((scope, anchor, ids, cumulative))
    return paths, nodes


def chain_of(nodes: dict[tuple[int, int], StoredPrefix], leaf: tuple[int, int]) -> list[tuple[int, int]]:
    chain: list[tuple[int, int]] = []
    key: tuple[int, int] | None = leaf
    while key is not None:
        chain.append(key)
        parent = nodes[key].parent
        key = None if parent is None else (key[0], parent)
    return chain


def read(paths: list[Row], leaves: list[tuple[int, int]]) -> ChainsNeeded:
    needed = ChainsNeeded(leaves)
    for row in reversed(paths):  # newest first, as the read streams them
        needed.take(*row)
    return needed


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 40), share=st.floats(0.05, 1.0))
def test_the_read_keeps_exactly_the_nodes_on_the_counted_leaves_chains(
    seed: int, rows: int, share: float
) -> None:
    paths, nodes = stored_forest(seed, rows)
    rng = random.Random(seed)
    leaves = rng.sample(sorted(nodes), max(1, int(len(nodes) * share)))
    needed = read(paths, leaves)
    on_chains = {key: nodes[key] for leaf in leaves for key in chain_of(nodes, leaf)}
    assert needed.unresolved() == set()
    assert needed.prefixes() == on_chains
    kept, taken = needed.bounded(leaves, None)
    assert ({(scope, p.prefix_id): p for scope, p in kept}, taken) == (on_chains, set(leaves))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 40), max_nodes=st.integers(0, 60))
def test_a_bound_takes_the_most_recent_leaves_whose_chains_fit(seed: int, rows: int, max_nodes: int) -> None:
    paths, nodes = stored_forest(seed, rows)
    leaves = random.Random(seed).sample(sorted(nodes), len(nodes))  # most recent first
    kept, taken = read(paths, leaves).bounded(leaves, max_nodes)
    assert len(kept) <= max_nodes
    prefix = leaves[: len(taken)]
    assert set(prefix) == taken, "the most recent ones, none skipped"
    assert {(scope, p.prefix_id): p for scope, p in kept} == {
        key: nodes[key] for leaf in prefix for key in chain_of(nodes, leaf)
    }
    if len(taken) < len(leaves):
        more = {key for leaf in leaves[: len(taken) + 1] for key in chain_of(nodes, leaf)}
        assert len(more) > max_nodes, "the next leaf's chain would not have fitted"


def test_an_anchor_met_before_its_need_is_known_is_reported_and_found_when_handed_again() -> None:
    # Two rows of one batch share a time: the read may hand the parent's row first.
    parent_row: Row = (1, None, [1, 2], [16, 32])
    child_row: Row = (1, 2, [3], [48])
    needed = ChainsNeeded([(1, 3)])
    needed.take(*parent_row)
    needed.take(*child_row)
    assert needed.unresolved() == {(1, 2)}
    needed.take(*parent_row)
    assert needed.unresolved() == set()
    assert set(needed.prefixes()) == {(1, 1), (1, 2), (1, 3)}


def test_where_a_node_stands_in_two_rows_the_oldest_rows_word_stands() -> None:
    # A planner whose node cache forgot node 2 wrote its chain again, with another token estimate.
    needed = ChainsNeeded([(1, 3)])
    needed.take(1, 2, [3], [50])
    needed.take(1, None, [1, 2], [16, 33])  # the second write, newer
    needed.take(1, None, [1, 2], [16, 32])  # the first
    assert needed.prefixes()[(1, 2)] == StoredPrefix(2, 1, 32)
    assert needed.prefixes()[(1, 3)] == StoredPrefix(3, 2, 50)


def test_nodes_below_the_deepest_needed_one_and_other_scopes_are_not_kept() -> None:
    needed = ChainsNeeded([(1, 2)])
    needed.take(2, None, [1, 2, 3], [16, 32, 48])  # the same ids in another scope
    needed.take(1, None, [1, 2, 3], [16, 32, 48])
    assert set(needed.prefixes()) == {(1, 1), (1, 2)}
