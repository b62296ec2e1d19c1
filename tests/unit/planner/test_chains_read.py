"""A plan's read keeps the nodes on the counted leaves' chains, and at most `max_nodes` of them
(`core/chains_read.py`): checked against chains walked directly, on forests stored as ingestion stores them
(runs of new nodes anchored at nodes stored before, packed a batch at a time)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmplane.services.planner.core.chains_read import ChainsNeeded, LeafCounts
from warmplane.services.planner.policy import StoredPrefix
from warmplane.shared.chain_nodes import (
    LEAF_BYTES,
    NODE_BYTES,
    ChainNodes,
    pack_leaves,
    unpack,
    unpack_leaves,
)

Row = tuple[int, int | None, list[int], list[int]]
"""(scope, anchor, ids, tokens): a run of new nodes, as a batch adds it."""


def stored_forest(seed: int, rows: int) -> tuple[list[Row], dict[tuple[int, int], StoredPrefix]]:
    """`rows` runs of new nodes, oldest first, in two scopes, each under a root or under a node of an
    earlier run (a conversation's next turn, or a chat under a system prompt); and every node."""
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


def packed(*runs: Row) -> dict[int, ChainNodes]:
    """The runs as a batch stores them: a packed value a scope (`shared/chain_nodes.py`), through it."""
    by_scope: dict[int, ChainNodes] = {}
    for scope, anchor, ids, tokens in runs:
        by_scope.setdefault(scope, ChainNodes()).add_run(anchor, 0, ids, tokens)
    return {scope: unpack(nodes.pack()) for scope, nodes in by_scope.items()}


def read(paths: list[Row], leaves: list[tuple[int, int]], per_batch: int = 3) -> ChainsNeeded:
    """`paths` stored `per_batch` runs to a batch, read newest batch first."""
    needed = ChainsNeeded(leaves)
    batches = [paths[at : at + per_batch] for at in range(0, len(paths), per_batch)]
    for batch in reversed(batches):
        for scope, nodes in packed(*batch).items():
            needed.take(scope, nodes)
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


def test_a_parent_no_row_holds_ends_the_chain_there() -> None:
    # Node 12's row was swept: 13 is kept, and 12 is reported needed.
    needed = ChainsNeeded([(1, 13), (1, 7)])
    for scope, nodes in packed((1, None, [1, 7], [16, 32]), (1, 12, [13], [96])).items():
        needed.take(scope, nodes)
    assert needed.unresolved() == {(1, 12)}
    assert needed.prefixes() == {
        (1, 1): StoredPrefix(1, None, 16), (1, 7): StoredPrefix(7, 1, 32), (1, 13): StoredPrefix(13, 12, 96)
    }  # fmt: skip


def test_where_a_node_is_stored_twice_the_oldest_rows_word_stands() -> None:
    # A planner whose node cache forgot node 2 wrote its chain again, with another token estimate.
    needed = ChainsNeeded([(1, 3)])
    for row in ((1, 2, [3], [50]), (1, None, [1, 2], [16, 33]), (1, None, [1, 2], [16, 32])):  # newest first
        for scope, nodes in packed(row).items():
            needed.take(scope, nodes)
    assert needed.prefixes()[(1, 2)] == StoredPrefix(2, 1, 32)
    assert needed.prefixes()[(1, 3)] == StoredPrefix(3, 2, 50)


def test_nodes_below_the_deepest_needed_one_and_other_scopes_are_not_kept() -> None:
    needed = ChainsNeeded([(1, 2)])
    rows = packed((2, None, [1, 2, 3], [16, 32, 48]), (1, None, [1, 2, 3], [16, 32, 48]))
    for scope, nodes in rows.items():
        needed.take(scope, nodes)
    assert set(needed.prefixes()) == {(1, 1), (1, 2)}


def test_packed_nodes_come_back_as_they_were_added() -> None:
    nodes = ChainNodes()
    nodes.add_run(None, 0, [1, -(2**63)], [16, 32])
    nodes.add_run(1, 1, [2**63 - 1], [2**31 - 1])
    back = unpack(nodes.pack())
    assert (list(back.ids), list(back.parents), list(back.tokens), list(back.depths)) == (
        [1, -(2**63), 2**63 - 1], [1, 1, 1], [16, 32, 2**31 - 1], [0, 1, 1]
    )  # fmt: skip
    assert len(nodes.pack()) == 3 * NODE_BYTES
    with pytest.raises(ValueError, match="not whole nodes"):
        unpack(nodes.pack()[:-1])


def test_packed_leaves_come_back_in_order() -> None:
    entries = [(-(2**63), 0), (2**63 - 1, 29_406_960), (7, -1), (7, -1)]
    packed = pack_leaves(entries)
    assert len(packed) == 4 * LEAF_BYTES
    assert packed[:16] == (-(2**63)).to_bytes(8, "big", signed=True) + bytes(8)  # big-endian, interleaved
    assert list(unpack_leaves(packed)) == entries
    assert list(unpack_leaves(b"")) == []
    with pytest.raises(ValueError, match="not whole requests"):
        unpack_leaves(packed[:-8])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 40), since=st.integers(0, 3))
def test_counts_kept_with_the_chains_add_up_with_the_stored_ones(seed: int, rows: int, since: int) -> None:
    """Each run's leaf is counted in a few buckets, either in `prefix_stats` or in the row that adds it (a
    request at a leaf its batch added): the read sums both, in the order one table would give, and keeps
    the chains of every leaf counted since `since`."""
    paths, nodes = stored_forest(seed, rows)
    rng = random.Random(seed)
    per_batch = 3
    stats: list[tuple[int, int, int, int]] = []
    in_rows: dict[int, dict[int, list[tuple[int, int]]]] = {}  # batch -> scope -> (leaf, bucket) a request
    for at, (scope, _anchor, ids, _tokens) in enumerate(paths):
        counted = [(rng.randint(0, 5), rng.randint(1, 3)) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.5:
            stats += [(scope, ids[-1], bucket, requests) for bucket, requests in counted]
        else:
            entries = in_rows.setdefault(at // per_batch, {}).setdefault(scope, [])
            entries += [(ids[-1], bucket) for bucket, requests in counted for _ in range(requests)]
    every = stats + [
        (scope, leaf, bucket, 1)
        for by_scope in in_rows.values()
        for scope, entries in by_scope.items()
        for leaf, bucket in entries
    ]
    whole = LeafCounts([c for c in every if c[2] >= since], since, None)

    counted_split = LeafCounts([c for c in stats if c[2] >= since], since, None)
    needed = ChainsNeeded(counted_split.leaves())
    batches = [paths[at : at + per_batch] for at in range(0, len(paths), per_batch)]
    for number in reversed(range(len(batches))):
        for scope, chain_nodes in packed(*batches[number]).items():
            stored = unpack_leaves(pack_leaves(in_rows.get(number, {}).get(scope, [])))  # as a row holds them
            needed.want(scope, counted_split.take(scope, stored))
            needed.take(scope, chain_nodes)

    leaves = whole.leaves()
    assert counted_split.leaves() == leaves
    assert counted_split.counts(leaves) == whole.counts(leaves)
    assert all(bucket >= since for _, _, bucket, _ in whole.counts(leaves))
    assert needed.prefixes() == {key: nodes[key] for leaf in leaves for key in chain_of(nodes, leaf)}


def test_leaves_met_in_rows_beyond_the_bound_are_left_out() -> None:
    counted = LeafCounts([(1, 9, 5, 1)], 0, 2)
    assert counted.take(1, [(7, 5), (8, 4), (9, 6), (10, 5), (7, 6)]) == [7, 8]
    assert counted.leaves() == [(1, 7), (1, 9), (1, 8)]
    assert counted.counts([(1, 7), (1, 9)]) == [(1, 7, 5, 1), (1, 7, 6, 1), (1, 9, 5, 1), (1, 9, 6, 1)]
