"""`trie_from_counts` resolves each stored prefix once for all the leaves below it (`_Forest`) and counts
each leaf up its chain (`PrefixTrie.observe_leaves`). Property: over random stored forests (unknown
leaves, loops, parents nobody stored, roots without tokens, chains whose tokens dip) the trie is exactly,
node for node and float for float, the one `observe` gives for each leaf's chain walked up from the leaf,
heaviest leaf first, with the same leaves left out."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from warmplane.services.planner.policy import LeafCount, PrefixTrie, StoredPrefix, trie_from_counts

NOW = 10_000.0


def _walked(by_id: dict[int, StoredPrefix], leaf: int) -> list[StoredPrefix] | None:
    """`leaf`'s chain, root first, walked up one parent at a time; None if unknown or looping."""
    chain: list[StoredPrefix] = []
    step = by_id.get(leaf)
    while step is not None:
        if step in chain:
            return None
        chain.append(step)
        step = by_id.get(step.parent) if step.parent is not None else None
    return chain[::-1] or None


def _reference(
    prefixes: list[StoredPrefix], counts: list[LeafCount], half_life_s: float
) -> tuple[PrefixTrie, int]:
    """The trie of `counts` by `observe`, a chain at a time."""
    by_id = {p.prefix_id: p for p in prefixes}
    trie = PrefixTrie(half_life_s)
    weights: dict[int, float] = {}
    for count in counts:
        if count.requests > 0:
            decay = trie.decay_factor(max(0.0, NOW - count.at_s))
            weights[count.leaf] = weights.get(count.leaf, 0.0) + count.requests * decay
    left_out = 0
    for leaf in sorted(weights, key=lambda leaf: (-weights[leaf], leaf)):
        if weights[leaf] == 0:
            continue
        chain = _walked(by_id, leaf)
        if chain is None or chain[0].tokens <= 0:
            left_out += 1
            continue
        tokens = list(itertools.accumulate((p.tokens for p in chain), max))
        trie.observe([p.prefix_id for p in chain], tokens, NOW, weights[leaf])
    return trie, left_out


def _nodes(trie: PrefixTrie) -> list[tuple[int, int | None, int, int, int, float, float]]:
    return [(n.prefix_id, n.parent, n.depth, n.tokens, n.own_tokens, n.count, n.stamp) for n in trie.nodes()]


ids = st.integers(1, 40)
forests = st.lists(
    st.tuples(ids, st.one_of(st.none(), st.integers(1, 45)), st.sampled_from([-5, 0, 10, 50, 200, 900])),
    max_size=40,
    unique_by=lambda row: row[0],
)
bucket_middles = st.sampled_from([0.0, 5_000.0, 9_970.0, 9_990.0, 10_030.0])
leaf_counts = st.lists(st.tuples(st.integers(1, 45), bucket_middles, st.integers(0, 4)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(rows=forests, raw_counts=leaf_counts)
def test_the_trie_is_the_one_observing_each_leaf_s_chain_gives(
    rows: list[tuple[int, int | None, int]], raw_counts: list[tuple[int, float, int]]
) -> None:
    prefixes = [StoredPrefix(*row) for row in rows]
    counts = [LeafCount(*count) for count in raw_counts]
    for half_life_s in (60.0, 600.0):
        trie, left_out = trie_from_counts(prefixes, counts, NOW, half_life_s)
        expected, expected_left_out = _reference(prefixes, counts, half_life_s)
        assert left_out == expected_left_out
        assert _nodes(trie) == _nodes(expected)
    blended, _ = trie_from_counts(prefixes, counts, NOW, 60.0, 600.0)
    slow, fast = _reference(prefixes, counts, 600.0)[0], _reference(prefixes, counts, 60.0)[0]
    assert _nodes(blended) == _nodes(slow)
    for node in blended.nodes():
        expected_rate = (slow.rate(node.prefix_id, NOW) + fast.rate(node.prefix_id, NOW)) / 2
        assert blended.rate(node.prefix_id, NOW) == expected_rate
