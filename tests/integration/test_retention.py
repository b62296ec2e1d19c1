"""The retention sweep drops old ledger rows, catalog payloads and statistics buckets, and nothing younger."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg

from warmplane.services.planner.pg_retention import STATISTICS_TABLES, sweep_statistics
from warmplane.services.planner.pg_store import PgIngestStore


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
        # Buckets 0 to 9, three keys each, in every statistics table.
        await pool.execute(
            "INSERT INTO prefix_stats (scope_id, prefix_id, bucket, requests)"
            " SELECT 1, k, b, 1 FROM generate_series(0, 9) b, generate_series(1, 3) k"
        )
        await pool.execute(
            "INSERT INTO miss_stats (scope_id, prefix_id, bucket, misses)"
            " SELECT 1, k, b, 1 FROM generate_series(0, 9) b, generate_series(1, 3) k"
        )
        await pool.execute(
            "INSERT INTO replica_stats (replica, bucket, scope_id, requests)"
            " SELECT 'r' || k, b, 1, 1 FROM generate_series(0, 9) b, generate_series(1, 3) k"
        )
        removed = await sweep_statistics(pool, before_bucket=4, chunk=5)  # 12 rows a table: 3 chunks
        assert removed == 3 * 12
        for table in STATISTICS_TABLES:
            kept = await pool.fetchval(f"SELECT array_agg(DISTINCT bucket ORDER BY bucket) FROM {table}")
            assert kept == list(range(4, 10)), table
        assert await sweep_statistics(pool, before_bucket=4) == 0
    finally:
        await pool.close()
