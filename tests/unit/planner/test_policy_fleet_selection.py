"""A fleet's warm sets in one pass (`select_warm_sets`) equal each replica's chosen alone, by the plain
per-replica definition below (the selection as it was before the pass was shared): the sharing only
saves the walks, never changes a set."""

from __future__ import annotations

from collections.abc import Collection, Container

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmplane.services.planner.policy import (
    ChosenPrefix,
    PolicyKnobs,
    PrefixTrie,
    RingSpec,
    RoutingShare,
    WarmBudget,
    choose_for_replica,
    choose_for_replicas,
    reuse_probability,
    select_warm_sets,
)
from warmplane.services.planner.policy.prefix_trie import TrieNode
from warmplane.shared.hash_ring import HashRing

MEMBERS = [f"r{i}" for i in range(6)]


def reference_warm_set(
    trie: PrefixTrie,
    now: float,
    share: RoutingShare,
    limit: int,
    *,
    ramp_window_s: float,
    min_reuse: float,
    resident: Collection[int],
    renderable: Container[int] | None,
    max_items: int | None,
) -> list[ChosenPrefix]:
    """One replica's warm set, by walking the whole trie for it."""
    owned: dict[int, bool] = {}
    for node in trie.nodes():
        if node.depth < share.routing_depth:
            owned[node.prefix_id] = True
        elif node.depth == share.routing_depth:
            owned[node.prefix_id] = share.owns_key(node.prefix_id)
        else:
            owned[node.prefix_id] = node.parent is not None and owned.get(node.parent, False)
    covered = set(resident)
    probabilities: dict[int, float] = {}
    for node in trie.nodes():
        if owned[node.prefix_id] and node.prefix_id not in covered:
            rate = trie.rate(node.prefix_id, now)
            if node.depth < share.routing_depth:
                rate *= share.weight_fraction
            probabilities[node.prefix_id] = reuse_probability(rate, ramp_window_s)
    scored = sorted(
        (
            (probabilities[node.prefix_id], node)
            for node in trie.nodes()
            if probabilities.get(node.prefix_id, 0.0) > 0
            and probabilities[node.prefix_id] >= min_reuse
            and node.own_tokens > 0
            and (renderable is None or node.prefix_id in renderable)
        ),
        key=lambda pair: (-pair[0], pair[1].depth, pair[1].prefix_id),
    )
    chosen: list[ChosenPrefix] = []
    remaining, rendered = limit, 0
    items_left = max_items if max_items is not None else len(probabilities)
    for _, node in scored:
        if remaining <= 0 or rendered >= items_left:
            break
        if node.prefix_id in covered:
            continue
        path = uncovered_chain(trie, node, covered)
        cost = sum(step.own_tokens for step in path)
        renders = sum(1 for step in path if renderable is None or step.prefix_id in renderable)
        if cost > remaining or rendered + renders > items_left:
            continue
        remaining -= cost
        rendered += renders
        for step in path:
            covered.add(step.prefix_id)
            chosen.append(
                ChosenPrefix(
                    step.prefix_id, step.depth, step.tokens, step.own_tokens, probabilities[step.prefix_id]
                )
            )
    return chosen


def uncovered_chain(trie: PrefixTrie, node: TrieNode, covered: set[int]) -> list[TrieNode]:
    path: list[TrieNode] = []
    step: TrieNode | None = node
    while step is not None and step.prefix_id not in covered:
        path.append(step)
        step = trie.node(step.parent) if step.parent is not None else None
    return path[::-1]


# Requests as (branches, arrival); an id names its whole path, as chained hashes do.
requests = st.lists(
    st.tuples(st.lists(st.integers(0, 4), min_size=1, max_size=5), st.floats(0, 600)), min_size=1, max_size=60
)


def fed_trie(seen: list[tuple[list[int], float]]) -> PrefixTrie:
    trie = PrefixTrie(half_life_s=120)
    for branches, at in seen:
        chain = [hash(tuple(branches[: depth + 1])) for depth in range(len(branches))]
        trie.observe(chain, [100 * (depth + 1) + branches[depth] for depth in range(len(chain))], at)
    return trie


@settings(max_examples=200, deadline=None)
@given(
    seen=requests,
    members=st.integers(1, 6),
    weights=st.lists(st.sampled_from([0.25, 0.5, 1.0]), min_size=6, max_size=6),
    depth=st.integers(0, 2),
    limits=st.lists(st.integers(0, 2_000), min_size=6, max_size=6),
    min_reuse=st.sampled_from([0.0, 0.2, 0.6]),
    resident_seed=st.integers(0, 3),
    render_every=st.sampled_from([None, 1, 2, 3]),
    max_items=st.sampled_from([None, 1, 3, 10]),
)
def test_each_replicas_set_in_one_pass_equals_its_set_chosen_alone(  # noqa: PLR0917 (hypothesis passes positionally)
    seen: list[tuple[list[int], float]],
    members: int,
    weights: list[float],
    depth: int,
    limits: list[int],
    min_reuse: float,
    resident_seed: int,
    render_every: int | None,
    max_items: int | None,
) -> None:
    trie = fed_trie(seen)
    ids = sorted(node.prefix_id for node in trie.nodes())
    ring = HashRing(dict(zip(MEMBERS[:members], weights, strict=False)), vnodes=16)
    planned = {replica: limits[i] for i, replica in enumerate(MEMBERS[:members])}
    resident = {
        replica: set(ids[i % (resident_seed + 2) :: resident_seed + 2]) if resident_seed else set()
        for i, replica in enumerate(planned)
    }
    renderable = None if render_every is None else set(ids[::render_every])
    together = select_warm_sets(
        trie,
        600.0,
        ring=ring,
        routing_depth=depth,
        limits=planned,
        ramp_window_s=300.0,
        min_reuse_probability=min_reuse,
        resident=resident,
        renderable=renderable,
        max_items=max_items,
    )
    assert set(together) == set(planned)
    for replica, limit in planned.items():
        alone = reference_warm_set(
            trie,
            600.0,
            RoutingShare(ring, replica, depth),
            limit,
            ramp_window_s=300.0,
            min_reuse=min_reuse,
            resident=resident[replica],
            renderable=renderable,
            max_items=max_items,
        )
        assert together[replica] == alone


def test_the_fleet_path_plans_every_replica_on_one_ring_of_members_and_planned() -> None:
    trie = fed_trie([([key, 1], 0.0) for key in range(5)] + [([key], 1.0) for key in range(5)])
    common = {
        "members": ["r0", "r1"],
        "ring": RingSpec(depth=0, vnodes=16),
        "budget": WarmBudget(tokens=10_000),
        "knobs": PolicyKnobs(min_reuse_probability=0.0),
    }
    fleet = choose_for_replicas(trie, 2.0, capacities={"r1": 4_000, "new": None}, **common)  # type: ignore[arg-type]
    ring = HashRing(["new", "r0", "r1"], vnodes=16)
    for replica, capacity in (("r1", 4_000), ("new", None)):
        items, limit = fleet[replica]
        assert limit == (2_000 if capacity else 10_000)
        assert {ring.owner(item.prefix_id) for item in items if item.depth == 0} <= {replica}
    # Each as if planned alone on a ring of the members and the replicas planned together.
    common["members"] = ["r0", "r1", "new"]
    assert choose_for_replica(trie, 2.0, replica="new", kv_capacity_tokens=None, **common) == fleet["new"]  # type: ignore[arg-type]
    assert choose_for_replica(trie, 2.0, replica="r1", kv_capacity_tokens=4_000, **common) == fleet["r1"]  # type: ignore[arg-type]


def test_a_replica_the_ring_does_not_hold_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\['stranger'\] are not on the ring"):
        select_warm_sets(
            fed_trie([([1], 0.0)]),
            0.0,
            ring=HashRing(["r0"]),
            routing_depth=0,
            limits={"stranger": 100},
            ramp_window_s=300.0,
            min_reuse_probability=0.0,
        )
