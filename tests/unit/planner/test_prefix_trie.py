"""The policy's prefix trie: decayed counts, their invariants, late observations, pruning."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmplane.services.planner.policy import PrefixTrie

# Requests as (chain, arrival). Branches are drawn from a small space so that chains share prefixes; an id
# names its whole path, as chained hashes do.
chains = st.lists(st.integers(0, 3), min_size=1, max_size=5).map(
    lambda branches: [hash(tuple(branches[: depth + 1])) for depth in range(len(branches))]
)
observations = st.lists(st.tuples(chains, st.floats(0, 1_000)), min_size=1, max_size=30)


def tokens_for(chain: list[int]) -> list[int]:
    return [100 * (depth + 1) for depth in range(len(chain))]


def test_a_count_halves_every_half_life() -> None:
    trie = PrefixTrie(half_life_s=60)
    trie.observe([1, 2], [100, 200], now=0)
    trie.observe([1, 3], [100, 180], now=0)
    assert trie.count(1, 0) == 2 and trie.count(2, 0) == 1
    assert trie.count(1, 60) == pytest.approx(1.0)
    assert trie.count(1, 120) == pytest.approx(0.5)
    assert trie.count(99, 0) == 0


def test_nodes_keep_depth_parent_and_the_tokens_of_their_own_block() -> None:
    trie = PrefixTrie(half_life_s=60)
    trie.observe([1, 2, 3], [512, 1024, 1300], now=5)
    node = trie.node(3)
    assert node is not None
    assert (node.parent, node.depth, node.tokens, node.own_tokens) == (2, 2, 1300, 276)
    assert trie.path(3) == [1, 2, 3] and trie.path(42) == []


def test_a_late_observation_counts_as_already_decayed() -> None:
    trie = PrefixTrie(half_life_s=10)
    trie.observe([1], [100], now=20)
    trie.observe([1], [100], now=10)
    assert trie.count(1, 20) == pytest.approx(1.5)


def test_rate_is_count_over_the_decay_integral() -> None:
    trie = PrefixTrie(half_life_s=100)
    trie.observe([1], [100], now=0)
    assert trie.rate(1, 0) == pytest.approx(0.693147 / 100, rel=1e-5)


def test_bad_input_is_refused_and_changes_nothing() -> None:
    trie = PrefixTrie(half_life_s=10)
    with pytest.raises(ValueError, match="tokens"):
        trie.observe([1, 2], [100], now=0)
    with pytest.raises(ValueError, match="non-decreasing"):
        trie.observe([1, 2], [200, 100], now=0)
    with pytest.raises(ValueError, match="half_life_s"):
        PrefixTrie(half_life_s=0)
    assert len(trie) == 0


def test_pruning_forgets_cold_prefixes_and_keeps_parents_of_what_remains() -> None:
    trie = PrefixTrie(half_life_s=10)
    trie.observe([1, 2], [100, 200], now=0)
    trie.observe([1, 3], [100, 200], now=100)
    assert trie.prune(now=100, min_count=0.5) == 1
    assert 2 not in trie and 1 in trie and 3 in trie


@settings(max_examples=200)
@given(observations, st.floats(0, 2_000), st.floats(0, 2_000))
def test_decayed_counts_never_grow_without_observations(
    seen: list[tuple[list[int], float]], earlier: float, later_by: float
) -> None:
    trie = PrefixTrie(half_life_s=30)
    for chain, now in seen:
        trie.observe(chain, tokens_for(chain), now)
    for node in trie.nodes():
        assert trie.count(node.prefix_id, earlier + later_by) <= trie.count(node.prefix_id, earlier)


@settings(max_examples=200)
@given(observations, st.floats(0, 2_000))
def test_a_prefix_counts_at_least_as_much_as_any_child(
    seen: list[tuple[list[int], float]], now: float
) -> None:
    trie = PrefixTrie(half_life_s=30)
    for chain, at in seen:
        trie.observe(chain, tokens_for(chain), at)
    for node in trie.nodes():
        if node.parent is not None:
            assert trie.count(node.parent, now) >= trie.count(node.prefix_id, now) * (1 - 1e-9)


@settings(max_examples=200)
@given(
    before=observations,
    drawn=st.lists(
        st.tuples(
            chains,
            st.none()
            | st.lists(st.integers(-5, 600), max_size=6),  # None: the chain's own; else most refused
            st.sampled_from([0.0, -1.0, 0.5, 1.0, 3.0]),  # weights: some refused
        ),
        max_size=30,
    ),
    now=st.floats(0, 1_500),
)
def test_observing_all_at_once_is_observing_each_in_turn(
    before: list[tuple[list[int], float]], drawn: list[tuple[list[int], list[int] | None, float]], now: float
) -> None:
    """A trie of earlier observations (some stamped after `now`), then a batch at `now` with bad ones
    in it: one pass gives the trie that one `observe` per chain gives, refusals included."""
    batch = [
        (chain, tokens_for(chain) if tokens is None else tokens, weight) for chain, tokens, weight in drawn
    ]
    one_by_one, at_once = PrefixTrie(half_life_s=60), PrefixTrie(half_life_s=60)
    for chain, at in before:
        one_by_one.observe(chain, tokens_for(chain), at)
        at_once.observe(chain, tokens_for(chain), at)
    refused = 0
    for chain, tokens, weight in batch:
        try:
            one_by_one.observe(chain, tokens, now, weight)
        except ValueError:
            refused += 1
    assert at_once.observe_all(batch, now) == refused
    assert list(at_once.nodes()) == list(one_by_one.nodes())
    assert at_once.observe_all([([], [], 1.0)], now) == 0  # as observe: nothing to count, nothing wrong
