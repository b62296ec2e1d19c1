"""Postgres sums each batch's staged rows into the aggregates the events add up to (migrations 0006,
0009, 0017).

The planner's fold only lays events out one row each; these are the assertions on the sums, per
(scope, prefix, time bucket), per (scope, time bucket) and per (replica, scope, time bucket), across
batches, against real Postgres. A request at a leaf its own batch adds is counted in that leaf's chain row
and its sums in `scope_traffic`; the others in `prefix_stats` (migration 0017).
"""

from __future__ import annotations

import random
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from warmplane.services.planner.core.ingest_batch import Scope, fold_events
from warmplane.services.planner.core.node_cache import NodeCache
from warmplane.services.planner.pg_store import PgIngestStore
from warmplane.shared.chain_nodes import unpack_leaves
from warmplane.shared.events import Event, ModelRef, PrefixMissed, RequestObserved
from warmplane.shared.prefix_chain import Namespace, chain_from_segments
from warmplane.shared.traffic_sums import TRAFFIC_SUMS

MODEL = ModelRef("llama", "rev-1")
BASE = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SEGMENTS = {b"a": 1, b"b": 2, b"c": 5}
StatKey = tuple[Scope, int, int]
ScopeKey = tuple[Scope, int]
ReplicaKey = tuple[str, Scope, int]
REPLICAS = ("r0", "r1", "pod/r-2")


@pytest.fixture
async def pool(migrated_database: str) -> AsyncIterator[asyncpg.Pool]:
    # One session: rows staged by a batch and left behind would be counted again by the next.
    pool = await asyncpg.create_pool(
        migrated_database, min_size=1, max_size=1, init=PgIngestStore.prepare_session
    )
    try:
        yield pool
    finally:
        await pool.close()


def epoch_seconds(at: datetime) -> int:
    return (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(seconds=1)


def random_event(rng: random.Random) -> RequestObserved | PrefixMissed:
    """A request (or, one time in four, a miss) in one of four scopes, served by one of three
    replicas, over a chain of up to four segments, within ten minutes of BASE to the microsecond."""
    tenant, revision = rng.choice(["acme", "globex"]), rng.choice(["", "v2"])
    path = [rng.choice(sorted(SEGMENTS)) for _ in range(rng.randint(1, 4))]
    chain = chain_from_segments(Namespace(tenant, MODEL.name, revision), path, [SEGMENTS[s] for s in path])
    common: dict[str, object] = dict(
        event_id=uuid.uuid4(),
        occurred_at=BASE + timedelta(seconds=rng.randint(0, 600), microseconds=rng.randint(0, 999_999)),
        producer="test",
        tenant=tenant,
        model=MODEL,
        prompt_rev=revision,
        replica=rng.choice(REPLICAS),
        chain=list(chain.ids),
        chain_tokens=list(chain.tokens),
    )
    if rng.random() < 0.25:
        return PrefixMissed(
            **common,  # type: ignore[arg-type]
            resident_depth=rng.randint(0, len(path) + 1),
            cached_tokens=rng.randint(0, chain.tokens[-1] + 10),
        )
    prompt_tokens = chain.tokens[-1] + rng.randint(0, 50)
    return RequestObserved(
        **common,  # type: ignore[arg-type]
        prompt_tokens=prompt_tokens,
        cached_tokens=rng.choice([0, 0, min(chain.tokens[0], prompt_tokens), prompt_tokens]),
        ttft_ms=rng.choice([None, rng.uniform(0, 5_000)]),
    )


def expected_sums(
    events: list[Event], bucket_seconds: int
) -> tuple[dict[StatKey, list[float]], dict[StatKey, list[int]]]:
    """Request sums (requests, cold, prompt, cached, ttft sum, ttft count) and miss sums (misses,
    missed tokens) per (scope, prefix, bucket), added up one event at a time."""
    requests: dict[StatKey, list[float]] = defaultdict(lambda: [0, 0, 0, 0, 0.0, 0])
    misses: dict[StatKey, list[int]] = defaultdict(lambda: [0, 0])
    for event in events:
        assert isinstance(event, RequestObserved | PrefixMissed)
        scope = (event.tenant, event.model.name, event.prompt_rev)
        bucket = epoch_seconds(event.occurred_at) // bucket_seconds
        if isinstance(event, RequestObserved):
            _add_request(requests[(scope, event.chain[-1], bucket)], event)
        else:
            first_missing = event.chain[min(event.resident_depth, len(event.chain) - 1)]
            counts = misses[(scope, first_missing, bucket)]
            counts[0] += 1
            counts[1] += max(0, event.chain_tokens[-1] - event.cached_tokens)
    return requests, misses


def expected_replica_sums(events: list[Event], bucket_seconds: int) -> dict[ReplicaKey, list[float]]:
    """Request sums (requests, cold, prompt, cached, ttft sum, ttft count) per (replica, scope,
    bucket); misses count nowhere here."""
    sums: dict[ReplicaKey, list[float]] = defaultdict(lambda: [0, 0, 0, 0, 0.0, 0])
    for event in events:
        if isinstance(event, RequestObserved):
            scope = (event.tenant, event.model.name, event.prompt_rev)
            bucket = epoch_seconds(event.occurred_at) // bucket_seconds
            _add_request(sums[(event.replica, scope, bucket)], event)
    return sums


def _add_request(sums: list[float], event: RequestObserved) -> None:
    """Adds `event` to a row of request sums (requests, cold, prompt, cached, ttft sum, ttft count)."""
    sums[0] += 1
    sums[1] += event.cached_tokens == 0
    sums[2] += event.prompt_tokens
    sums[3] += event.cached_tokens
    sums[4] += event.ttft_ms or 0.0
    sums[5] += event.ttft_ms is not None


async def stored_replica_sums(db: asyncpg.Pool) -> dict[ReplicaKey, list[float]]:
    rows = await db.fetch(
        "SELECT r.replica, s.tenant, s.model, s.prompt_rev, r.bucket, r.requests, r.cold_requests,"
        " r.prompt_tokens, r.cached_tokens, r.ttft_ms_sum, r.ttft_count"
        " FROM replica_stats r JOIN scopes s USING (scope_id)"
    )
    return {(r[0], (r[1], r[2], r[3]), r[4]): list(r[5:]) for r in rows}


async def stored_sums(
    db: asyncpg.Pool,
) -> tuple[dict[StatKey, int], dict[ScopeKey, list[float]], dict[StatKey, list[int]]]:
    """Requests per (scope, leaf, bucket), request sums per (scope, bucket), misses per (scope, prefix,
    bucket), wherever each is kept."""
    requests = await db.fetch(
        "SELECT s.tenant, s.model, s.prompt_rev, p.prefix_id, p.bucket, p.requests"
        " FROM prefix_requests p JOIN scopes s USING (scope_id)"
    )
    sums = f"scope_id, bucket, {', '.join(TRAFFIC_SUMS)}"
    by_scope = await db.fetch(
        f"SELECT s.tenant, s.model, s.prompt_rev, t.bucket, {', '.join(f'sum(t.{c})' for c in TRAFFIC_SUMS)}"
        f" FROM (SELECT {sums} FROM prefix_stats UNION ALL SELECT {sums} FROM scope_traffic) t"
        " JOIN scopes s USING (scope_id) GROUP BY 1, 2, 3, 4"
    )
    misses = await db.fetch(
        "SELECT s.tenant, s.model, s.prompt_rev, m.prefix_id, m.bucket, m.misses, m.missed_tokens"
        " FROM miss_stats m JOIN scopes s USING (scope_id)"
    )
    return (
        {((r[0], r[1], r[2]), r[3], r[4]): r[5] for r in requests},
        {((r[0], r[1], r[2]), r[3]): list(r[4:]) for r in by_scope},
        {((r[0], r[1], r[2]), r[3], r[4]): list(r[5:]) for r in misses},
    )


def by_scope_and_bucket(sums: dict[StatKey, list[float]]) -> dict[ScopeKey, list[float]]:
    added: dict[ScopeKey, list[float]] = defaultdict(lambda: [0, 0, 0, 0, 0.0, 0])
    for (scope, _leaf, bucket), each in sums.items():
        added[(scope, bucket)] = [a + b for a, b in zip(added[(scope, bucket)], each, strict=True)]
    return added


@pytest.mark.parametrize("bucket_seconds", [1, 7, 60, 3600])
async def test_counters_are_sums_per_scope_prefix_and_bucket_across_batches(
    pool: asyncpg.Pool, bucket_seconds: int
) -> None:
    rng = random.Random(bucket_seconds)
    store = PgIngestStore(pool, "g", bucket_seconds)
    nodes = NodeCache()
    events: list[Event] = []
    at_stored_leaves: list[Event] = []
    for _ in range(4):  # later batches add to the rows earlier ones made
        batch_events: list[Event] = [random_event(rng) for _ in range(250)]
        at_stored_leaves += [
            e for e in batch_events if isinstance(e, RequestObserved) and (scope_key(e), e.chain[-1]) in nodes
        ]
        batch = fold_events(batch_events, stored_nodes=nodes.by_scope)
        await store.write([], batch)
        nodes.add_all(batch.new_nodes, now=0.0)
        events += batch_events

    expected_requests, expected_misses = expected_sums(events, bucket_seconds)
    requests, by_scope, misses = await stored_sums(pool)
    assert requests == {key: sums[0] for key, sums in expected_requests.items()}
    expected_by_scope = by_scope_and_bucket(expected_requests)
    assert by_scope.keys() == expected_by_scope.keys()
    for scope_bucket, scope_sums in by_scope.items():
        assert scope_sums == pytest.approx(expected_by_scope[scope_bucket])
    assert misses == expected_misses
    # Only the requests at leaves stored before their batch have rows of their own, with every sum.
    in_stats, _ = expected_sums(at_stored_leaves, bucket_seconds)
    rows = await pool.fetch(
        "SELECT s.tenant, s.model, s.prompt_rev, p.prefix_id, p.bucket, p.requests, p.cold_requests,"
        " p.prompt_tokens, p.cached_tokens, p.ttft_ms_sum, p.ttft_count"
        " FROM prefix_stats p JOIN scopes s USING (scope_id)"
    )
    stats = {((r[0], r[1], r[2]), r[3], r[4]): list(r[5:]) for r in rows}
    assert stats.keys() == in_stats.keys() and len(stats) > 0
    for key, sums in stats.items():
        assert sums == pytest.approx(in_stats[key])
    # The chain rows' entries read the same in Python (a plan's read) as in SQL (the view).
    packed = await pool.fetch("SELECT scope_id, leaves FROM prefix_chains")
    read = Counter((scope, leaf, bucket) for scope, value in packed for leaf, bucket in unpack_leaves(value))
    in_sql = await pool.fetch(
        "SELECT c.scope_id, l.prefix_id, l.bucket, count(*)"
        " FROM prefix_chains c, warmplane_chain_leaves(c.leaves) AS l GROUP BY 1, 2, 3"
    )
    assert read == Counter({(r[0], r[1], r[2]): r[3] for r in in_sql}) and read
    expected_replicas = expected_replica_sums(events, bucket_seconds)
    by_replica = await stored_replica_sums(pool)
    assert by_replica.keys() == expected_replicas.keys()
    assert {key[0] for key in by_replica} == set(REPLICAS)
    for replica_key, replica_sums in by_replica.items():
        assert replica_sums == pytest.approx(expected_replicas[replica_key])


def scope_key(event: RequestObserved) -> Scope:
    return (event.tenant, event.model.name, event.prompt_rev)


async def test_buckets_are_occurred_at_seconds_floor_divided_by_the_width(pool: asyncpg.Pool) -> None:
    chain = chain_from_segments(Namespace("acme", MODEL.name, ""), [b"a"], [1])
    events: list[Event] = [
        RequestObserved(
            event_id=uuid.uuid4(),
            occurred_at=datetime.fromtimestamp(seconds, UTC),
            producer="test",
            tenant="acme",
            model=MODEL,
            replica="r0",
            chain=list(chain.ids),
            chain_tokens=list(chain.tokens),
            prompt_tokens=1,
        )
        for seconds in (119.999, 120.0, 179.5, 180.0, 1_764_417_659.999_999)
    ]
    await PgIngestStore(pool, "g", 60).write([], fold_events(events, stored_nodes={}))
    rows = await pool.fetch("SELECT bucket, requests FROM prefix_requests ORDER BY bucket")
    assert [tuple(row) for row in rows] == [(1, 1), (2, 2), (3, 1), (29_406_960, 1)]
