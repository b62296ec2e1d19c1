"""Planner ingestion on the real broker and Postgres: exact counts, idempotency, registry, catalog."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import asyncpg
import msgspec

from tests.integration.planner.ingest_stream import SUMMED
from tests.integration.planner_harness import MODEL, poll_until, produce, request
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    DeployStarted,
    Event,
    PrefixMissed,
    PrefixPayload,
    ReplicaBecameReady,
    ReplicaEvent,
    ReplicaStarted,
    ReplicaWarmingStarted,
    RequestObserved,
)


async def test_counts_each_event_once_and_records_the_fleet(planner_settings: PlannerSettings) -> None:
    now = datetime.now(UTC)
    events: list[Event] = []
    for i in range(300):
        tenant = ("acme", "globex")[i % 2]
        events.append(
            request(
                [1, 10 + i % 7],
                tenant=tenant,
                cached_tokens=100 * (i % 3 == 0),
                replica=("r-a", "r-b", "r-c", "r-d")[i % 4],
            )
        )
    duplicated = request([1, 99])
    events += [duplicated, duplicated, duplicated]
    payload = PrefixPayload(prefix_id=5, messages=[{"role": "system", "content": "You are terse."}])
    events.append(request([5, 6], payload=payload))
    events.append(
        PrefixMissed(
            event_id=new_event_id(),
            occurred_at=now,
            producer="test",
            tenant="acme",
            model=MODEL,
            replica="replica-1",
            chain=[1, 11, 12],
            chain_tokens=[100, 200, 300],
            resident_depth=1,
            cached_tokens=100,
        )
    )
    # Out of order on purpose: the latest occurrence must win in the registry.
    events += [
        _lifecycle(ReplicaBecameReady, now + timedelta(seconds=3)),
        _lifecycle(ReplicaStarted, now, endpoint="http://127.0.0.1:9"),
        _lifecycle(ReplicaWarmingStarted, now + timedelta(seconds=2)),
        DeployStarted(
            event_id=new_event_id(), occurred_at=now, producer="ci", model=MODEL, prompt_revs=["v2"]
        ),
    ]
    await produce(planner_settings.kafka, events)
    requests = {e.event_id: e for e in events if isinstance(e, RequestObserved)}
    expected = Counter((e.tenant, e.chain[-1]) for e in requests.values())

    db = await asyncpg.connect(planner_settings.postgres.asyncpg_dsn())
    try:
        async with running_planner(planner_settings) as planner:

            async def all_counted() -> bool:
                changes = await db.fetchval("SELECT count(*) FROM fleet_changes")
                total = await db.fetchval("SELECT coalesce(sum(requests), 0) FROM prefix_requests")
                return bool(changes == 1 and total == sum(expected.values()))

            await poll_until(all_counted, timeout_s=30, what="every request counted")
            assert planner.metrics.duplicates._value.get() == 2

        rows = await db.fetch(
            "SELECT s.tenant, p.prefix_id, sum(p.requests) AS n"
            " FROM prefix_requests p JOIN scopes s USING (scope_id) GROUP BY 1, 2"
        )
        assert Counter({(r["tenant"], r["prefix_id"]): r["n"] for r in rows}) == expected
        cold = sum(1 for e in requests.values() if e.cached_tokens == 0)
        # A request's sums are in prefix_stats or, at a leaf its batch added, in scope_traffic (0017).
        assert await db.fetchval(SUMMED.format("cold_requests")) == cold
        # The same requests, once each, per replica (the duplicate's copies not among them).
        by_replica = await db.fetch(
            "SELECT replica, sum(requests) AS n, sum(cold_requests) AS cold, sum(cached_tokens) AS cached"
            " FROM replica_stats GROUP BY 1"
        )
        assert {r["replica"]: (r["n"], r["cold"], r["cached"]) for r in by_replica} == {
            name: (
                sum(1 for e in requests.values() if e.replica == name),
                sum(1 for e in requests.values() if e.replica == name and e.cached_tokens == 0),
                sum(e.cached_tokens for e in requests.values() if e.replica == name),
            )
            for name in {e.replica for e in requests.values()}
        }

        nodes = await db.fetch("SELECT prefix_id, parent_id FROM prefix_nodes")
        edges = {r["prefix_id"]: r["parent_id"] for r in nodes}
        assert edges[1] is None and edges[10] == 1 and edges[99] == 1 and edges[6] == 5

        stored = await db.fetchrow("SELECT payload, tokens FROM prefix_catalog WHERE prefix_id = 5")
        assert msgspec.json.decode(stored["payload"].encode(), type=PrefixPayload) == payload
        assert stored["tokens"] == 100

        miss = await db.fetchrow("SELECT prefix_id, misses, missed_tokens FROM miss_stats")
        assert (miss["prefix_id"], miss["misses"], miss["missed_tokens"]) == (11, 1, 200)

        replica = await db.fetchrow(
            "SELECT state, endpoint, node FROM replicas WHERE replica_id = $1", "replica-1"
        )
        assert dict(replica) == {"state": "ready", "endpoint": "http://127.0.0.1:9", "node": "node-a"}
        assert await db.fetchval("SELECT count(*) FROM replica_transitions") == 3
    finally:
        await db.close()


async def test_a_replayed_stream_changes_nothing(planner_settings: PlannerSettings) -> None:
    events = [request([7, 70 + i % 5], replica=f"r-{i % 3}") for i in range(200)]
    await produce(planner_settings.kafka, events)
    db = await asyncpg.connect(planner_settings.postgres.asyncpg_dsn())
    try:
        total = "SELECT coalesce(sum(requests), 0) FROM prefix_requests"
        async with running_planner(planner_settings):
            await poll_until(lambda: _equals(db, total, 200), timeout_s=30, what="200 requests counted")
        before = await db.fetch("SELECT * FROM prefix_requests ORDER BY prefix_id, bucket")
        replicas_before = await db.fetch("SELECT * FROM replica_stats ORDER BY replica, bucket, scope_id")
        assert sum(row["requests"] for row in replicas_before) == 200

        # The same events again (a producer's retry, an operator's replay), then a marker to wait for.
        marker = request([8, 80], replica="marker")
        await produce(planner_settings.kafka, [*events, marker])
        async with running_planner(planner_settings) as planner:
            # The marker may sit on another partition than the copies: wait for both to be read.
            async def marker_counted_and_copies_skipped() -> bool:
                return await _equals(db, total, 201) and planner.metrics.duplicates._value.get() >= 200

            await poll_until(marker_counted_and_copies_skipped, timeout_s=30, what="the copies skipped")
            # At least the 200 copies were skipped; under load a rebalance may also re-read a few of the
            # originals before the restored positions apply, and those are skipped alike. What counts is
            # below: the aggregates did not move.
        after = await db.fetch(
            "SELECT * FROM prefix_requests WHERE prefix_id <> 80 ORDER BY prefix_id, bucket"
        )
        assert after == before
        replicas_after = await db.fetch(
            "SELECT * FROM replica_stats WHERE replica <> 'marker' ORDER BY replica, bucket, scope_id"
        )
        assert replicas_after == replicas_before
    finally:
        await db.close()


def _lifecycle(kind: type[ReplicaEvent], at: datetime, endpoint: str = "") -> ReplicaEvent:
    return kind(
        event_id=new_event_id(),
        occurred_at=at,
        producer="warmer",
        model=MODEL,
        replica="replica-1",
        node="node-a",
        endpoint=endpoint,
    )


async def _equals(db: asyncpg.Connection, query: str, value: int) -> bool:
    return bool(await db.fetchval(query) == value)
