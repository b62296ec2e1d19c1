"""The pure fold of a batch into columns and chain paths, and the bounded cache of chain nodes known to
be stored. Postgres sums the columns: tests/integration/planner/test_ingest_sums.py."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmplane.services.planner.core.ingest_batch import (
    ChainEdge,
    Scope,
    ScopedPrefix,
    fold_events,
)
from warmplane.services.planner.core.node_cache import NodeCache
from warmplane.shared.events import (
    DeployStarted,
    HeldPrefixes,
    ModelRef,
    PrefixMissed,
    PrefixPayload,
    ReplicaBecameReady,
    ReplicaResidency,
    RequestObserved,
    WarmPlanIssued,
    WarmProgressed,
)
from warmplane.shared.prefix_chain import Namespace, chain_from_segments

MODEL = ModelRef("llama", "rev-1")
BASE = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SEGMENT_TOKENS = {b"a": 1, b"b": 2, b"c": 5}
"""Each segment's own token count: a node's cumulative count is then a function of its path."""

scopes = st.tuples(st.sampled_from(["acme", "globex"]), st.just(MODEL.name), st.sampled_from(["", "v2"]))
paths = st.lists(st.sampled_from(sorted(SEGMENT_TOKENS)), min_size=1, max_size=4)
times = st.builds(
    lambda seconds, micros: BASE + timedelta(seconds=seconds, microseconds=micros),
    st.integers(0, 600),
    st.integers(0, 999_999),
)


def chain_of(scope: Scope, path: Sequence[bytes]) -> tuple[list[int], list[int]]:
    """Real chain ids over `path`: every id then determines its parent, depth and tokens."""
    chain = chain_from_segments(Namespace(*scope), path, [SEGMENT_TOKENS[s] for s in path])
    return list(chain.ids), list(chain.tokens)


@st.composite
def requests(draw: st.DrawFn) -> RequestObserved:
    scope = draw(scopes)
    chain, tokens = chain_of(scope, draw(paths))
    prompt_tokens = tokens[-1] + draw(st.integers(0, 50))
    return RequestObserved(
        event_id=uuid.uuid4(),
        occurred_at=draw(times),
        producer="test",
        tenant=scope[0],
        model=MODEL,
        prompt_rev=scope[2],
        replica=draw(st.sampled_from(["r0", "r1", "r/2"])),
        chain=chain,
        chain_tokens=tokens,
        prompt_tokens=prompt_tokens,
        cached_tokens=draw(st.sampled_from([0, 0, min(tokens[0], prompt_tokens), prompt_tokens])),
        ttft_ms=draw(st.none() | st.floats(0, 5_000)),
    )


@st.composite
def misses(draw: st.DrawFn) -> PrefixMissed:
    scope = draw(scopes)
    chain, tokens = chain_of(scope, draw(paths))
    return PrefixMissed(
        event_id=uuid.uuid4(),
        occurred_at=draw(times),
        producer="test",
        tenant=scope[0],
        model=MODEL,
        prompt_rev=scope[2],
        replica="r0",
        chain=chain,
        chain_tokens=tokens,
        resident_depth=draw(st.integers(0, len(chain) + 1)),
        cached_tokens=draw(st.integers(0, tokens[-1] + 10)),
    )


def scope_of(event: RequestObserved | PrefixMissed) -> Scope:
    return (event.tenant, event.model.name, event.prompt_rev)


@settings(max_examples=200)
@given(st.lists(requests(), max_size=30))
def test_requests_become_one_column_entry_each_in_order(events: list[RequestObserved]) -> None:
    """Postgres sums the columns (tests/integration/planner/test_ingest_sums.py): each request is there
    once."""
    batch = fold_events(events, stored_nodes={})

    columns = batch.requests
    assert list(
        zip(
            columns.scopes,
            columns.leaves,
            columns.seconds,
            columns.prompt_tokens,
            columns.cached_tokens,
            columns.ttft_ms,
            columns.replicas,
            strict=True,
        )
    ) == [
        (
            scope_of(e),
            e.chain[-1],
            e.occurred_at.timestamp(),
            e.prompt_tokens,
            e.cached_tokens,
            e.ttft_ms,
            e.replica,
        )
        for e in events
    ]
    assert batch.misses.scopes == []
    assert batch.scopes() == {scope_of(event) for event in events}


def _request_at(at: datetime, **changes: object) -> RequestObserved:
    chain, tokens = chain_of(("acme", MODEL.name, ""), [b"a"])
    fields: dict[str, object] = dict(
        event_id=uuid.uuid4(),
        occurred_at=at,
        producer="test",
        tenant="acme",
        model=MODEL,
        replica="r0",
        chain=chain,
        chain_tokens=tokens,
        prompt_tokens=tokens[-1],
    )
    fields.update(changes)
    return RequestObserved(**fields)  # type: ignore[arg-type]


def by_scope(nodes: set[ScopedPrefix]) -> dict[Scope, set[int]]:
    """`nodes` as a fold reads stored nodes: prefix ids by scope."""
    found: dict[Scope, set[int]] = {}
    for scope, prefix in nodes:
        found.setdefault(scope, set()).add(prefix)
    return found


def expected_edges(
    events: Sequence[RequestObserved], stored: set[ScopedPrefix]
) -> dict[ScopedPrefix, ChainEdge]:
    """Per chain, the nodes below its deepest stored node; each as the first event that carried it says.

    A chain that ends at an ancestor of a stored node, without passing through it, re-emits the
    ancestor: the fold cannot know it is stored, and the write is a no-op.
    """
    edges: dict[ScopedPrefix, ChainEdge] = {}
    for event in events:
        scope = scope_of(event)
        stored_depths = [d for d, prefix_id in enumerate(event.chain) if (scope, prefix_id) in stored]
        for depth in range(max(stored_depths, default=-1) + 1, len(event.chain)):
            parent = event.chain[depth - 1] if depth else None
            edge = ChainEdge(parent, depth, event.chain_tokens[depth])
            edges.setdefault((scope, event.chain[depth]), edge)
    return edges


@settings(max_examples=200)
@given(st.lists(requests(), min_size=1, max_size=20), st.data())
def test_edges_have_right_parents_and_skip_stored_nodes_and_their_ancestors(
    events: list[RequestObserved], data: st.DataObject
) -> None:
    every_node = sorted({(scope_of(e), prefix_id) for e in events for prefix_id in e.chain})
    stored = data.draw(st.sets(st.sampled_from(every_node)), label="stored")

    batch = fold_events(events, stored_nodes=by_scope(stored))

    assert batch.edges() == expected_edges(events, stored)
    assert not batch.edges().keys() & stored
    assert {(scope, p) for scope, new in batch.new_nodes.items() for p in new} == batch.edges().keys()
    parents = {
        (scope_of(e), p): (e.chain[d - 1] if d else None) for e in events for d, p in enumerate(e.chain)
    }
    assert all(edge.parent_id == parents[node] for node, edge in batch.edges().items())
    # A request's leaf not known stored is one the batch adds: its count goes with the chain row (0017).
    added = batch.requests.leaf_added
    assert added == [(scope_of(e), e.chain[-1]) not in stored for e in events]
    assert all(e.chain[-1] in batch.new_nodes[scope_of(e)] for e, a in zip(events, added, strict=True) if a)


def test_edges_of_a_fresh_chain_run_from_its_root() -> None:
    scope = ("acme", MODEL.name, "")
    chain, tokens = chain_of(scope, [b"a", b"b", b"c"])
    event = _request_at(BASE, chain=chain, chain_tokens=tokens, prompt_tokens=tokens[-1])
    batch = fold_events([event], stored_nodes={scope: {chain[0]}})
    assert batch.edges() == {
        (scope, chain[1]): ChainEdge(chain[0], 1, 3),
        (scope, chain[2]): ChainEdge(chain[1], 2, 8),
    }
    root_too = fold_events([event], stored_nodes={})
    assert root_too.edges()[(scope, chain[0])] == ChainEdge(None, 0, 1)
    # Packed as stored: ids, parents (a root's its own id), cumulative tokens, depths.
    nodes = root_too.chains[scope]
    assert [list(column) for column in (nodes.ids, nodes.parents, nodes.tokens, nodes.depths)] == [
        chain,
        [chain[0], *chain[:-1]],
        tokens,
        [0, 1, 2],
    ]


def test_a_payload_is_catalogued_with_the_tokens_of_its_prefix() -> None:
    scope = ("acme", MODEL.name, "")
    chain, tokens = chain_of(scope, [b"a", b"b", b"c"])
    payload = PrefixPayload(prefix_id=chain[1], messages=[{"role": "system", "content": "hi"}])
    event = _request_at(BASE, chain=chain, chain_tokens=tokens, prompt_tokens=9, payload=payload)
    entry = fold_events([event], stored_nodes={}).catalog[(scope, chain[1])]
    assert (entry.payload, entry.tokens, entry.seen_at) == (payload, 3, BASE)


@settings(max_examples=200)
@given(st.lists(misses(), max_size=30))
def test_misses_are_keyed_by_the_first_non_resident_element(events: list[PrefixMissed]) -> None:
    batch = fold_events(events, stored_nodes={})

    columns = batch.misses
    assert list(
        zip(columns.scopes, columns.prefixes, columns.seconds, columns.missed_tokens, strict=True)
    ) == [
        (
            scope_of(e),
            e.chain[min(e.resident_depth, len(e.chain) - 1)],
            e.occurred_at.timestamp(),
            max(0, e.chain_tokens[-1] - e.cached_tokens),
        )
        for e in events
    ]
    assert batch.requests.scopes == [] and batch.chains == {}


def test_a_miss_example() -> None:
    scope = ("acme", MODEL.name, "")
    chain, tokens = chain_of(scope, [b"a", b"b", b"c"])
    miss = PrefixMissed(
        event_id=uuid.uuid4(), occurred_at=BASE, producer="t", tenant="acme", model=MODEL, replica="r",
        chain=chain, chain_tokens=tokens, resident_depth=1, cached_tokens=1,
    )  # fmt: skip
    columns = fold_events([miss], stored_nodes={}).misses
    assert (columns.scopes, columns.prefixes, columns.missed_tokens) == ([scope], [chain[1]], [7])


def test_other_events_are_routed_or_ignored() -> None:
    ready = ReplicaBecameReady(
        event_id=uuid.uuid4(), occurred_at=BASE, producer="w", model=MODEL, replica="r", node="n"
    )
    deploy = DeployStarted(event_id=uuid.uuid4(), occurred_at=BASE, producer="ci", model=MODEL)
    progress = WarmProgressed(
        event_id=uuid.uuid4(), occurred_at=BASE, producer="w", model=MODEL, plan_id=uuid.uuid4(),
        replica="r", items_done=1, items_total=2,
    )  # fmt: skip
    plan = WarmPlanIssued(
        event_id=uuid.uuid4(), occurred_at=BASE, producer="p", model=MODEL, plan_id=uuid.uuid4(), replica="r",
        node="n", epoch=0, items=[], budget_tokens=1, deadline=BASE,
    )  # fmt: skip
    batch = fold_events([ready, deploy, progress, plan], stored_nodes={})
    assert batch.replica_events == [ready]
    assert batch.fleet_changes == [deploy]
    assert batch.plan_results == [progress]
    assert batch.ignored == 1
    assert batch.requests.scopes == [] and batch.scopes() == set()


def _report(replica: str, seconds: int, event_id: int) -> ReplicaResidency:
    return ReplicaResidency(
        event_id=uuid.UUID(int=event_id), occurred_at=BASE + timedelta(seconds=seconds), producer="w",
        model=MODEL, replica=replica, node="n", incarnation=uuid.UUID(int=1),
        held=[HeldPrefixes("acme", "", 0, [seconds])],
    )  # fmt: skip


@given(st.permutations([("r", 1, 10), ("r", 3, 5), ("r", 3, 7), ("r", 2, 99), ("s", 0, 1)]))
def test_a_batch_keeps_each_replicas_newest_report_in_any_order(order: list[tuple[str, int, int]]) -> None:
    """Later `occurred_at` first, then the larger event id: the same report stands whatever the order."""
    batch = fold_events([_report(*fields) for fields in order], stored_nodes={})
    assert {r: (e.occurred_at, e.event_id.int) for r, e in batch.residency.items()} == {
        "r": (BASE + timedelta(seconds=3), 7),
        "s": (BASE, 1),
    }
    assert batch.ignored == 0 and batch.has_records


def test_node_cache_rejects_a_capacity_below_one() -> None:
    with pytest.raises(ValueError, match="capacity"):
        NodeCache(0)


@settings(max_examples=200)
@given(st.integers(1, 16), st.lists(st.lists(st.integers(0, 40), max_size=10), max_size=20))
def test_node_cache_stays_bounded_and_remembers_what_fits(capacity: int, batches: list[list[int]]) -> None:
    cache = NodeCache(capacity)
    remembered: set[ScopedPrefix] = set()
    for numbers in batches:
        cache.add_all({("acme", "m", ""): numbers}, now=0.0)
        remembered |= {(("acme", "m", ""), n) for n in numbers}
        if len(remembered) > capacity:  # the model of the cache: emptied whole when it overflows
            remembered = set()
        assert len(cache) <= capacity
        assert set(cache) == remembered


def test_node_cache_empties_when_it_overflows() -> None:
    cache = NodeCache(10)
    cache.add_all({("acme", "m", ""): range(10)}, now=0.0)
    assert (("acme", "m", ""), 0) in cache
    cache.add_all({("acme", "m", ""): [10]}, now=0.0)
    assert len(cache) == 0
