"""Retention of the statistics tables and of the stored chains, a bounded chunk at a time.

`prefix_stats`, `miss_stats` and `replica_stats` gain a row per key and bucket while traffic flows
(migration 0011 indexes their buckets for this). Deleting in chunks keeps each statement's locks and
write-ahead log short, beside ingestion, which only touches current buckets.

Two cuts. Per-prefix request counts are the plans' input and weigh only within the plans' window, so
`prefix_stats` keeps the detail cut (`detail_retention_hours`, about a day); each older chunk moves into
`scope_traffic`, summed per scope and bucket, in the statement that deletes it (migration 0015): a request
is in exactly one of the two tables at any moment, so the API's traffic view, which reads both, never
loses or double-counts one. `scope_traffic`, `miss_stats` and `replica_stats` keep the statistics' cut
(`stats_retention_hours`, 31 days) for the API's history.

`prefix_chains` gains a row per batch and scope (each the batch's new chain nodes, packed), and goes by
age alone: a row written more than `chains_slack_s` before the detail cut. That keeps every chain a
retained count reaches, for a planner anchors a batch's new nodes only at nodes its node cache holds, and
the cache holds nothing remembered more than its `max_age_s` ago and forgets all at once
(`core/node_cache.py`): so a chain counted at time t lies whole in rows written after t - `max_age_s`
(its cached nodes' ancestors were cached with them). The planner passes twice the cache's age, to
allow for the planner's lag behind event time and the two clocks. So the chains a plan reads span the
detail's day, not the statistics' month, and the sweep reads no other table.

A replica's history grows with every start of every replica, and a fleet that autoscales names new
replicas all day: `warm_plans` (each row holds its items, payloads included, twice), `replica_transitions`,
`replica_residency` and the `replicas` rows of replicas long gone. `sweep_history` drops what is older
than its cut and no longer read: replicas gone or failed since before the cut, with all their rows; and
of the others, plans and transitions of earlier incarnations. A replica's latest start and the plans
from the one answering it on stay, whatever their age, since `PgPlanStore.held` reads what the replica
holds from them. Deploys, bumps, scale events and cold-start alarms are a few rows a day and are kept.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

import asyncpg

from warmplane.shared.traffic_sums import TRAFFIC_SUMS

STATISTICS_TABLES: Final = ("scope_traffic", "miss_stats", "replica_stats")
"""The tables kept to the statistics' cut (`prefix_stats` keeps the detail cut and moves into the first)."""
_CHUNK: Final = 50_000

# One statement deletes a chunk of detail and adds its sums: both commit or neither does.
_ROLL_UP: Final = f"""
WITH moved AS (
    DELETE FROM prefix_stats WHERE ctid = ANY(ARRAY(SELECT ctid FROM prefix_stats WHERE bucket < $1 LIMIT $2))
    RETURNING scope_id, bucket, {", ".join(TRAFFIC_SUMS)}
), added AS (
    INSERT INTO scope_traffic AS t (scope_id, bucket, {", ".join(TRAFFIC_SUMS)})
    SELECT scope_id, bucket, {", ".join(f"sum({c})" for c in TRAFFIC_SUMS)}
    FROM moved GROUP BY scope_id, bucket
    ON CONFLICT (scope_id, bucket) DO UPDATE
    SET {", ".join(f"{c} = t.{c} + excluded.{c}" for c in TRAFFIC_SUMS)}
)
SELECT count(*) FROM moved
"""  # noqa: S608 - composed of constants

_OLD_CHAINS: Final = """
DELETE FROM prefix_chains
WHERE ctid = ANY(ARRAY(SELECT ctid FROM prefix_chains WHERE written_at < $1 LIMIT $2))
"""


_GONE_REPLICAS: Final = """
DELETE FROM replicas WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM replicas WHERE state IN ('gone', 'failed') AND state_since < $1 LIMIT $2))
"""
# Rows of replicas no longer registered (swept above, or never registered), past the cut.
_ORPHANS: Final = tuple(
    f"""
DELETE FROM {table} WHERE ctid = ANY(ARRAY(
    SELECT x.ctid FROM {table} x
    WHERE x.{at} < $1 AND NOT EXISTS (SELECT FROM replicas r WHERE r.replica_id = x.replica_id)
    LIMIT $2))
"""  # noqa: S608 - the table and column names are constants
    for table, at in (
        ("warm_plans", "issued_at"),
        ("replica_transitions", "occurred_at"),
        ("replica_residency", "occurred_at"),
    )
)
_LATEST_STARTS: Final = """
    SELECT DISTINCT ON (replica_id) replica_id, event_id FROM replica_transitions
    WHERE state = 'starting' ORDER BY replica_id, occurred_at DESC
"""
# A registered replica's plans before the plan answering its latest start: an earlier incarnation's.
_EARLIER_PLANS: Final = f"""
WITH latest AS ({_LATEST_STARTS}),
current AS (
    SELECT p.replica_id, min(p.issued_at) AS since
    FROM warm_plans p JOIN latest l ON p.replica_id = l.replica_id AND p.trigger_event_id = l.event_id
    GROUP BY p.replica_id
)
DELETE FROM warm_plans WHERE ctid = ANY(ARRAY(
    SELECT w.ctid FROM warm_plans w
    WHERE w.issued_at < $1
      AND NOT EXISTS (SELECT FROM current c WHERE c.replica_id = w.replica_id AND w.issued_at >= c.since)
    LIMIT $2))
"""  # noqa: S608 - composed of constants
_EARLIER_TRANSITIONS: Final = f"""
WITH latest AS ({_LATEST_STARTS})
DELETE FROM replica_transitions WHERE ctid = ANY(ARRAY(
    SELECT t.ctid FROM replica_transitions t
    WHERE t.occurred_at < $1 AND t.event_id NOT IN (SELECT event_id FROM latest)
    LIMIT $2))
"""  # noqa: S608 - composed of constants


async def sweep_history(pool: asyncpg.Pool, before: datetime, *, chunk: int = _CHUNK) -> int:
    """Delete the replica history older than `before` that nothing reads any more (see the module's
    docstring); the number of rows deleted."""
    removed = await _delete_in_chunks(pool, _GONE_REPLICAS, before, chunk)
    for statement in (*_ORPHANS, _EARLIER_PLANS, _EARLIER_TRANSITIONS):
        removed += await _delete_in_chunks(pool, statement, before, chunk)
    return removed


async def sweep_statistics(
    pool: asyncpg.Pool, *, detail_before_bucket: int, before_bucket: int, chunk: int = _CHUNK
) -> tuple[int, int]:
    """Move the `prefix_stats` rows of buckets before `detail_before_bucket` into `scope_traffic`, and
    delete the rows of `STATISTICS_TABLES` before `before_bucket`; (rows moved, rows deleted)."""
    moved = 0
    while True:
        count = await pool.fetchval(_ROLL_UP, detail_before_bucket, chunk)
        moved += count
        if count < chunk:
            break
    removed = 0
    for table in STATISTICS_TABLES:
        statement = (
            f"DELETE FROM {table} WHERE ctid = ANY(ARRAY("  # noqa: S608 - the table names are constants
            f"SELECT ctid FROM {table} WHERE bucket < $1 LIMIT $2))"
        )
        removed += await _delete_in_chunks(pool, statement, before_bucket, chunk)
    return moved, removed


async def sweep_chains(pool: asyncpg.Pool, written_before: datetime, *, chunk: int = _CHUNK) -> int:
    """Delete the `prefix_chains` rows written before `written_before` (the module's docstring says how
    far before the detail cut that must be); the number deleted."""
    return await _delete_in_chunks(pool, _OLD_CHAINS, written_before, chunk)


async def sweep_counts(
    pool: asyncpg.Pool,
    now: datetime,
    *,
    detail_hours: float,
    stats_hours: float,
    bucket_seconds: int,
    chains_slack_s: float,
) -> tuple[int, int, int]:
    """The statistics and chain sweeps at `now`, with the detail cut `detail_hours` back, the statistics'
    cut `stats_hours` back and the chains' `chains_slack_s` before the detail cut; (counts summed per scope,
    statistics rows deleted, chain rows deleted)."""
    detail_before = now - timedelta(hours=detail_hours)
    detail_bucket = int(detail_before.timestamp()) // bucket_seconds
    stats_bucket = int((now - timedelta(hours=stats_hours)).timestamp()) // bucket_seconds
    moved, removed = await sweep_statistics(
        pool, detail_before_bucket=detail_bucket, before_bucket=stats_bucket
    )
    chains = await sweep_chains(pool, detail_before - timedelta(seconds=chains_slack_s))
    return moved, removed, chains


async def _delete_in_chunks(
    pool: asyncpg.Pool, statement: str, cut: object, chunk: int, *more: object
) -> int:
    """Run `statement` (a DELETE of at most $2 rows past the cut $1, and `more` from $3 on) until it
    deletes less than a chunk."""
    removed = 0
    while True:
        status = await pool.execute(statement, cut, chunk, *more)
        count = int(status.split()[-1])
        removed += count
        if count < chunk:
            return removed
