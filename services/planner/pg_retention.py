"""Retention of the statistics tables and of the chain tree, a bounded chunk at a time.

`prefix_stats`, `miss_stats` and `replica_stats` gain a row per key and bucket while traffic flows
(migration 0011 indexes their buckets for this). Deleting in chunks keeps each statement's locks and
write-ahead log short, beside ingestion, which only touches current buckets.

`prefix_paths` gains about a row a request in chat traffic (each turn adds chain nodes). A row goes
once it is older than the statistics' cut and nothing still reaches it: no retained request or miss
statistic names one of its prefixes, and no other row hangs below one of them (migration 0012 indexes
`first_seen` and the anchors for this). A row whose children go in one sweep goes in a later one, so a
chain is taken down from its leaves, a level a sweep. `core/node_cache.py` argues why no planner keeps
trusting a node whose rows went.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

import asyncpg

STATISTICS_TABLES: Final = ("prefix_stats", "miss_stats", "replica_stats")
_CHUNK: Final = 50_000

# The three checks are ORed inside NOT so that Postgres keeps each a per-row index probe for all of the
# row's ids at once (`= ANY(ids)` on the key): as separate NOT EXISTS it made the miss check a hash
# anti-join on the scope alone, filtering every pair of rows of a scope (23 s against 0.84 s for the
# 86,000 rows past the cut of 383,000).
_UNREACHED_PATHS: Final = """
DELETE FROM prefix_paths WHERE ctid = ANY(ARRAY(
    SELECT p.ctid FROM prefix_paths p
    WHERE p.first_seen < $1
      AND NOT (EXISTS (SELECT FROM prefix_paths c WHERE c.scope_id = p.scope_id AND c.anchor_id = ANY(p.ids))
            OR EXISTS (SELECT FROM prefix_stats s WHERE s.scope_id = p.scope_id AND s.prefix_id = ANY(p.ids))
            OR EXISTS (SELECT FROM miss_stats m WHERE m.scope_id = p.scope_id AND m.prefix_id = ANY(p.ids)))
    LIMIT $2))
"""


async def sweep_statistics(pool: asyncpg.Pool, before_bucket: int, *, chunk: int = _CHUNK) -> int:
    """Delete every statistics row of a bucket before `before_bucket`; the number deleted."""
    removed = 0
    for table in STATISTICS_TABLES:
        statement = (
            f"DELETE FROM {table} WHERE ctid = ANY(ARRAY("  # noqa: S608 - the table names are constants
            f"SELECT ctid FROM {table} WHERE bucket < $1 LIMIT $2))"
        )
        removed += await _delete_in_chunks(pool, statement, before_bucket, chunk)
    return removed


async def sweep_paths(pool: asyncpg.Pool, seen_before: datetime, *, chunk: int = _CHUNK) -> int:
    """Delete the `prefix_paths` rows first seen before `seen_before` that no retained statistic and no
    other row reaches (see the module's docstring); the number deleted. Run it after `sweep_statistics`,
    with the same cut, so the rows of buckets just dropped go in the same sweep."""
    return await _delete_in_chunks(pool, _UNREACHED_PATHS, seen_before, chunk)


async def _delete_in_chunks(pool: asyncpg.Pool, statement: str, cut: object, chunk: int) -> int:
    """Run `statement` (a DELETE of at most $2 rows past the cut $1) until it deletes less than a chunk."""
    removed = 0
    while True:
        status = await pool.execute(statement, cut, chunk)
        count = int(status.split()[-1])
        removed += count
        if count < chunk:
            return removed
