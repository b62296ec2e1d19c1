"""Writing residency reports (`replica.residency`) into `replica_residency` (migration 0010).

Called by `PgIngestStore` inside a batch's transaction, so a report is stored exactly once with the
batch's offsets and ledger, like every other event the planner ingests.
"""

from __future__ import annotations

from collections.abc import Iterable

import asyncpg
import msgspec

from warmplane.shared.events import ReplicaResidency

_json = msgspec.json.Encoder()

# The newer report by (occurred_at, event_id) stands, the rule `ingest_batch.newer_report` applies within
# a batch: a redelivered report (same id and time) or an older one arriving late changes nothing.
UPSERT_RESIDENCY = """
INSERT INTO replica_residency AS r (replica_id, incarnation, event_id, occurred_at, held, held_count, lost,
                                    complete)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8)
ON CONFLICT (replica_id) DO UPDATE SET
    incarnation = excluded.incarnation, event_id = excluded.event_id, occurred_at = excluded.occurred_at,
    held = excluded.held, held_count = excluded.held_count, lost = excluded.lost, complete = excluded.complete
WHERE (excluded.occurred_at, excluded.event_id) > (r.occurred_at, r.event_id)
"""


async def record_residency(connection: asyncpg.Connection, reports: Iterable[ReplicaResidency]) -> None:
    """Store each report unless its replica's stored one is newer. Call inside the batch's transaction.

    Raises asyncpg's `DataError` if Postgres refuses a value (a NUL in a tenant name, which `jsonb` cannot
    hold): the caller's bisection dead-letters that report alone.
    """
    for report in sorted(reports, key=lambda r: r.replica):  # key order, as the other upserts lock rows
        await connection.execute(
            UPSERT_RESIDENCY,
            report.replica,
            report.incarnation,
            report.event_id,
            report.occurred_at,
            _json.encode(report.held).decode(),
            held_count(report),
            report.lost,
            report.complete,
        )


def held_count(report: ReplicaResidency) -> int:
    """How many prefix ids the report holds, over all its namespaces."""
    return sum(len(held.prefix_ids) for held in report.held)
