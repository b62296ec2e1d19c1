"""The evaluator's ceiling and its store: what a policy knowing only the history could warm usefully, within
the cap; the history as a sighting filter would keep it."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmplane.services.planner.trace_eval.evaluation import ceiling_blocks, evaluate
from warmplane.services.planner.trace_eval.fleet_sim import Request
from warmplane.services.planner.trace_eval.params import EvalParams
from warmplane.services.planner.trace_eval.policies import planner_view
from warmplane.services.planner.trace_eval.store_sim import stored_history
from warmplane.shared.hash_ring import HashRing

BLOCK = 10


def request(t: float, *chain: int) -> Request:
    own = (BLOCK,) * len(chain)
    return Request(t, chain, own, tuple(BLOCK * (i + 1) for i in range(len(chain))), chain[0])


def test_only_blocks_seen_before_and_used_within_five_minutes_in_order_of_first_use() -> None:
    history = [request(0, 1, 2, 3), request(5, 7, 8)]
    newcomer = [
        request(100, 7, 8, 9),  # 9 was never seen: no policy could have it
        request(110, 1, 2),
        request(500, 1, 2, 3),  # past the first 5 minutes after the join at 100
    ]
    params = EvalParams(block_tokens=BLOCK, capacity_blocks=100, capacity_fraction=1.0)
    assert ceiling_blocks(history, newcomer, 100, params) == [(7, BLOCK), (8, BLOCK), (1, BLOCK), (2, BLOCK)]
    capped = EvalParams(block_tokens=BLOCK, capacity_blocks=30, capacity_fraction=0.1)  # 30 tokens
    assert ceiling_blocks(history, newcomer, 100, capped) == [(7, BLOCK), (8, BLOCK), (1, BLOCK)]


@given(st.integers(0, 2**32))
def test_the_ceiling_wastes_nothing_and_no_policy_saves_more_in_five_minutes(seed: int) -> None:
    """On a random trace whose caches never evict, every block the ceiling warms is used (yield 1), and
    no policy, held to the same cap, saves more in the first five minutes."""
    rng = random.Random(seed)
    roots = [rng.getrandbits(30) for _ in range(6)]
    trace = []
    for i in range(120):
        root = rng.choice(roots)
        trace.append(request(i * 10.0, root, root + 1 + rng.randrange(4), rng.getrandbits(40)))
    params = EvalParams(block_tokens=BLOCK, capacity_blocks=10_000, capacity_fraction=0.002, replicas=2)
    result = evaluate("random", trace, params)
    ceiling = result.ceiling
    assert ceiling.spent <= params.limit_tokens
    assert ceiling.saved == ceiling.spent and ceiling.saved_5m == ceiling.spent
    capped = [o for o in result.outcomes if o.policy != "seed-replay"]
    assert all(o.saved_5m <= ceiling.saved_5m for o in capped), [(o.policy, o.saved_5m) for o in capped]


def test_on_traffic_that_never_repeats_the_planner_warms_nothing_and_says_why() -> None:
    """Every chain is seen once: the calibrated planner issues the newcomer an empty plan, the frontier's
    default point spends nothing, and the reliability table predicts (almost) no reuse."""
    trace = [request(i * 2.0, 3 * i + 1, 3 * i + 2, 3 * i + 3) for i in range(1_000)]
    params = EvalParams(block_tokens=BLOCK, capacity_blocks=10_000, replicas=2)
    result = evaluate("unique", trace, params)
    assert result.by_policy("warmplane").spent == 0
    assert (
        result.empty_plan
        == "warming buys little for model unique: no prefix is at least 5% likely to be reused"
    )
    assert result.calibration.startswith("fitted on ")
    assert result.calibration_gap <= 0.05
    assert all(point.tokens == 0 for point in result.frontier if float(point.label) > 0)


def test_a_sighting_filter_keeps_nodes_passed_often_enough_and_counts_each_request_where_cut() -> None:
    history = [request(0, 1, 2, 3), request(10, 1, 2, 4), request(20, 1, 5)]
    ring = HashRing(["r0"])
    every = planner_view(history, 30, ring, 0, EvalParams(block_tokens=BLOCK))
    filtered = planner_view(history, 30, ring, 0, EvalParams(block_tokens=BLOCK, admit_after=2))
    assert {node.prefix_id for node in every.trie.nodes()} == {1, 2, 3, 4, 5}
    # 1 is passed three times and 2 twice: kept; 3, 4 and 5 once: not. The first request passed only nodes
    # not yet seen and counts nowhere; the second counts at 2, the third at 1, each where it was cut.
    assert {node.prefix_id for node in filtered.trie.nodes()} == {1, 2}
    assert (every.trie.count(1, 30), every.trie.count(2, 30)) == pytest.approx((3.0, 2.0))
    assert (filtered.trie.count(1, 30), filtered.trie.count(2, 30)) == pytest.approx((2.0, 1.0))


def test_a_bounded_store_evicts_the_least_recently_passed_leaves_first_and_rolls_their_counts_up() -> None:
    history = [request(0, 1, 2, 3), request(1, 1, 2, 4), request(2, 1, 5), request(3, 1, 2, 4)]
    prefixes, leaves = stored_history(history, bucket_seconds=60, store_nodes=3)
    # 3 goes when 4 comes (its count to 2), 4 when 5 comes (to 2 as well), 5 when 4 comes back (to 1).
    assert [p.prefix_id for p in prefixes] == [4, 2, 1]  # least recently passed first
    assert {p.prefix_id: p.parent for p in prefixes} == {1: None, 2: 1, 4: 2}
    by_leaf = {leaf.leaf: leaf.requests for leaf in leaves}
    assert by_leaf == {2: 2, 4: 1, 1: 1}
    assert sum(by_leaf.values()) == len(history)  # no request lost while its root is kept
    with pytest.raises(ValueError, match="at least 1"):
        stored_history(history, bucket_seconds=60, store_nodes=0)


@given(st.integers(0, 2**32), st.integers(1, 12))
def test_a_bounded_store_stays_a_trie_within_its_bound(seed: int, bound: int) -> None:
    rng = random.Random(seed)
    history = []
    for t in range(40):
        chain, node = [], 0
        for _ in range(rng.randrange(1, 5)):
            node = node * 3 + rng.randrange(3) + 1  # a node's id names its path: one parent each
            chain.append(node)
        history.append(request(t, *chain))
    prefixes, leaves = stored_history(history, bucket_seconds=60, store_nodes=bound)
    kept = {p.prefix_id for p in prefixes}
    assert len(kept) <= bound
    assert all(p.parent is None or p.parent in kept for p in prefixes)
    assert {leaf.leaf for leaf in leaves} <= kept
