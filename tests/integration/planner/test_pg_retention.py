"""The retention sweep drops old ledger rows, catalog payloads, statistics buckets and old chain rows, and
nothing younger or still read."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg

from warmplane.services.planner.pg_plans import PgPlanStore
from warmplane.services.planner.pg_retention import (
    STATISTICS_TABLES,
    sweep_chains,
    sweep_counts,
    sweep_history,
    sweep_statistics,
)
from warmplane.services.planner.pg_store import PgIngestStore
from warmplane.shared.chain_nodes import pack_runs


async def test_sweep_removes_only_what_is_past_retention(migrated_database: str) -> None:
    now = datetime.now(UTC)
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:
        await pool.execute(
            "INSERT INTO ingest_ledger (topic, partition, first_offset, last_offset, event_ids, ingested_at)"
            " VALUES ('t', 0, 0, 9, ''::bytea, $1), ('t', 0, 10, 19, ''::bytea, $2)",
            now - timedelta(hours=30),
            now,
        )
        await pool.execute(
            "INSERT INTO prefix_catalog"
            " (scope_id, prefix_id, payload, payload_bytes, tokens, first_seen, last_seen)"
            " VALUES (1, 1, '{}', 2, 10, $1, $1), (1, 2, '{}', 2, 10, $2, $2)",
            now - timedelta(days=8),
            now - timedelta(days=1),
        )
        removed = await PgIngestStore(pool, "g", bucket_seconds=60).sweep(
            ledger_before=now - timedelta(hours=24), catalog_before=now - timedelta(days=7)
        )
        assert removed == (1, 1)
        assert await pool.fetchval("SELECT array_agg(first_offset) FROM ingest_ledger") == [10]
        assert await pool.fetchval("SELECT array_agg(prefix_id) FROM prefix_catalog") == [2]
    finally:
        await pool.close()


async def test_statistics_buckets_before_the_cut_go_in_chunks_and_later_ones_stay(
    migrated_database: str,
) -> None:
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:
        # Buckets 0 to 9, three keys each, in every statistics table; the detail in two scopes.
        await pool.execute(
            "INSERT INTO prefix_stats (scope_id, prefix_id, bucket, requests, prompt_tokens, ttft_ms_sum)"
            " SELECT s, k, b, k, 100 * k, 0.5 * k"
            " FROM generate_series(1, 2) s, generate_series(0, 9) b, generate_series(1, 3) k"
        )
        await pool.execute(
            "INSERT INTO miss_stats (scope_id, prefix_id, bucket, misses)"
            " SELECT 1, k, b, 1 FROM generate_series(0, 9) b, generate_series(1, 3) k"
        )
        await pool.execute(
            "INSERT INTO replica_stats (replica, bucket, scope_id, requests)"
            " SELECT 'r' || k, b, 1, 1 FROM generate_series(0, 9) b, generate_series(1, 3) k"
        )
        # Detail of buckets 0 to 5 is summed per scope (36 rows, chunks of 5), and what is before 4 goes.
        moved, removed = await sweep_statistics(pool, detail_before_bucket=6, before_bucket=4, chunk=5)
        assert (moved, removed) == (36, 2 * 4 + 12 + 12)
        detail = await pool.fetchval("SELECT array_agg(DISTINCT bucket ORDER BY bucket) FROM prefix_stats")
        assert detail == list(range(6, 10))
        for table in STATISTICS_TABLES:
            kept = await pool.fetchval(f"SELECT array_agg(DISTINCT bucket ORDER BY bucket) FROM {table}")
            assert kept == list(range(4, 10) if table != "scope_traffic" else [4, 5]), table
        summed = (
            "SELECT scope_id, bucket, requests, prompt_tokens, ttft_ms_sum FROM scope_traffic ORDER BY 1, 2"
        )
        sums = [tuple(row) for row in await pool.fetch(summed)]
        assert sums == [(s, b, 6, 600, 3.0) for s in (1, 2) for b in (4, 5)]
        assert await sweep_statistics(pool, detail_before_bucket=6, before_bucket=4) == (0, 0)

        # A request counted late into a bucket already summed is added to its sum, not lost or doubled.
        await pool.execute(
            "INSERT INTO prefix_stats (scope_id, prefix_id, bucket, requests) VALUES (1, 9, 5, 7)"
        )
        assert await sweep_statistics(pool, detail_before_bucket=6, before_bucket=4) == (1, 0)
        assert (
            await pool.fetchval("SELECT requests FROM scope_traffic WHERE (scope_id, bucket) = (1, 5)") == 13
        )
    finally:
        await pool.close()


async def test_a_sweep_at_now_cuts_the_detail_and_the_statistics_hours_back(migrated_database: str) -> None:
    """`sweep_counts` as the planner runs it: counts older than the detail hours are summed per scope, the
    sums older than the statistics hours go, and so do chain rows written before the detail cut and the
    chains' slack."""
    now = datetime.now(UTC)
    minute = int(now.timestamp()) // 60
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:
        await pool.execute(
            "INSERT INTO prefix_stats (scope_id, prefix_id, bucket, requests)"
            " VALUES (1, 1, $1, 1), (1, 2, $2, 1), (1, 3, $3, 1)",
            minute,  # kept in detail
            minute - 3 * 60,  # past the detail cut (2 h): summed
            minute - 30 * 60,  # past the statistics' cut (24 h): summed, then gone
        )
        await add_chain(pool, 1, [7, 8], now - timedelta(hours=3, minutes=1))  # past the cut and the slack
        await add_chain(pool, 1, [1], now - timedelta(hours=2, minutes=59))  # within the slack
        swept = await sweep_counts(
            pool, now, detail_hours=2, stats_hours=24, bucket_seconds=60, chains_slack_s=3600
        )
        assert swept == (2, 1, 1)
        assert await pool.fetchval("SELECT array_agg(prefix_id) FROM prefix_stats") == [1]
        assert await pool.fetchval("SELECT array_agg(bucket) FROM scope_traffic") == [minute - 3 * 60]
        assert await stored_ids(pool) == {(1, 1)}
    finally:
        await pool.close()


NOW = datetime.now(UTC)
CUT = NOW - timedelta(hours=27)


async def add_chain(pool: asyncpg.Pool, scope: int, ids: list[int], written: datetime) -> None:
    """A `prefix_chains` row as a batch writes it: `ids` a run under no anchor."""
    await pool.execute(
        "INSERT INTO prefix_chains (scope_id, written_at, nodes) VALUES ($1, $2, $3)",
        scope,
        written,
        pack_runs([(None, 0, ids, [10 * (i + 1) for i in range(len(ids))])]),
    )


async def stored_ids(pool: asyncpg.Pool) -> set[tuple[int, int]]:
    return {(r["scope_id"], r["prefix_id"]) for r in await pool.fetch("SELECT * FROM prefix_nodes")}


async def test_chain_rows_go_by_age_in_chunks_until_none_is_left_to_go(migrated_database: str) -> None:
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:
        for n in range(10):
            await add_chain(pool, 1, [100 * n + 1, 100 * n + 2], CUT - timedelta(minutes=n + 1))
        await add_chain(pool, 1, [2001], CUT + timedelta(minutes=1))
        await add_chain(pool, 2, [3001], NOW)
        assert await sweep_chains(pool, CUT, chunk=3) == 10  # chunks of 3, 3, 3 and 1
        assert await stored_ids(pool) == {(1, 2001), (2, 3001)}
        assert await sweep_chains(pool, CUT) == 0
    finally:
        await pool.close()


async def test_history_of_gone_replicas_and_earlier_incarnations_goes_and_what_held_reads_stays(
    migrated_database: str,
) -> None:
    now = datetime.now(UTC)

    def ago(days: float) -> datetime:
        return now - timedelta(days=days)

    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:

        async def replica(name: str, state: str, since: datetime) -> None:
            await pool.execute(
                "INSERT INTO replicas (replica_id, node, model, model_revision, endpoint, state, state_since,"
                " last_event_id) VALUES ($1, 'n', 'm', 'r1', '', $2, $3, $4)",
                name, state, since, uuid.uuid4(),
            )  # fmt: skip

        async def transition(name: str, state: str, at: datetime) -> uuid.UUID:
            event_id = uuid.uuid4()
            await pool.execute(
                "INSERT INTO replica_transitions (event_id, replica_id, state, occurred_at)"
                " VALUES ($1, $2, $3, $4)",
                event_id, name, state, at,
            )  # fmt: skip
            return event_id

        async def plan(name: str, at: datetime, trigger: uuid.UUID, prefix: int) -> uuid.UUID:
            plan_id = uuid.uuid4()
            items = f'[{{"prefix_id": {prefix}, "tokens": 10, "tenant": "acme", "epoch": 0}}]'
            await pool.execute(
                "INSERT INTO warm_plans (plan_id, replica_id, node, model, epoch, state, items,"
                " budget_tokens, deadline, issued_at, trigger_event_id, finished_at)"
                " VALUES ($1, $2, 'n', 'm', 0, 'verified', $3::jsonb, 10, $4, $4, $5, $4)",
                plan_id, name, items, at, trigger,
            )  # fmt: skip
            return plan_id

        # Gone eight days ago: everything of it goes.
        await replica("gone-old", "gone", ago(8))
        first = await transition("gone-old", "starting", ago(10))
        await transition("gone-old", "gone", ago(8))
        await plan("gone-old", ago(10), first, 1)
        await pool.execute(
            "INSERT INTO replica_residency (replica_id, incarnation, event_id, occurred_at, held, held_count,"
            " lost, complete) VALUES ('gone-old', $1, $2, $3, '[]', 0, 0, true)",
            first, uuid.uuid4(), ago(9),
        )  # fmt: skip
        # Gone yesterday: kept for now.
        await replica("gone-new", "gone", ago(1))
        await plan("gone-new", ago(9), await transition("gone-new", "starting", ago(9)), 2)
        # Ready, restarted nine days ago: its first incarnation goes; its latest start and plans stay.
        await replica("live", "ready", ago(8))
        earlier = await transition("live", "starting", ago(20))
        await transition("live", "ready", ago(19))
        latest = await transition("live", "starting", ago(9))
        await transition("live", "ready", ago(8))
        await plan("live", ago(20), earlier, 3)
        answering = await plan("live", ago(9), latest, 4)
        replan = await plan("live", ago(8.5), uuid.uuid4(), 5)
        recent = await plan("live", ago(1), uuid.uuid4(), 6)
        # Rows of a replica never registered: the old one goes.
        await transition("stray", "starting", ago(8))
        await transition("stray", "starting", ago(1))
        held_before = sorted(item.prefix_id for item in await PgPlanStore(pool).held("live"))

        # gone-old's row; its plan, 2 transitions and report, and stray's old transition; live's first
        # plan; live's 3 transitions but its latest start. In chunks of 2: a sweep sees each through.
        assert await sweep_history(pool, ago(7), chunk=2) == 1 + 5 + 1 + 3

        assert await pool.fetchval("SELECT array_agg(replica_id ORDER BY replica_id) FROM replicas") == [
            "gone-new",
            "live",
        ]
        plans = await pool.fetch("SELECT plan_id FROM warm_plans WHERE replica_id = 'live'")
        assert {row["plan_id"] for row in plans} == {answering, replan, recent}
        assert await pool.fetchval("SELECT count(*) FROM warm_plans WHERE replica_id = 'gone-new'") == 1
        kept = await pool.fetch("SELECT event_id FROM replica_transitions WHERE replica_id = 'live'")
        assert [row["event_id"] for row in kept] == [latest]
        assert await pool.fetchval("SELECT count(*) FROM replica_transitions WHERE replica_id = 'stray'") == 1
        assert await pool.fetchval("SELECT count(*) FROM replica_residency") == 0
        assert (
            sorted(item.prefix_id for item in await PgPlanStore(pool).held("live"))
            == held_before
            == [4, 5, 6]
        )
        assert await sweep_history(pool, ago(7)) == 0
    finally:
        await pool.close()
