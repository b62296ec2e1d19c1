"""The retention sweep drops old ledger rows and catalog payloads, and nothing younger."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg

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
