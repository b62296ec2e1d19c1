"""Retention of the statistics tables: buckets older than the retention go, a bounded chunk at a time.

`prefix_stats`, `miss_stats` and `replica_stats` gain a row per key and bucket while traffic flows
(migration 0011 indexes their buckets for this). Deleting in chunks keeps each statement's locks and
write-ahead log short, beside ingestion, which only touches current buckets.
"""

from __future__ import annotations

from typing import Final

import asyncpg

STATISTICS_TABLES: Final = ("prefix_stats", "miss_stats", "replica_stats")
_CHUNK: Final = 50_000


async def sweep_statistics(pool: asyncpg.Pool, before_bucket: int, *, chunk: int = _CHUNK) -> int:
    """Delete every statistics row of a bucket before `before_bucket`; the number deleted."""
    removed = 0
    for table in STATISTICS_TABLES:
        statement = (
            f"DELETE FROM {table} WHERE ctid = ANY(ARRAY("  # noqa: S608 - the table names are constants
            f"SELECT ctid FROM {table} WHERE bucket < $1 LIMIT $2))"
        )
        while True:
            status = await pool.execute(statement, before_bucket, chunk)
            count = int(status.split()[-1])
            removed += count
            if count < chunk:
                break
    return removed
