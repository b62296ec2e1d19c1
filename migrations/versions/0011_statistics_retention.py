"""Block-range indexes on the statistics tables' time bucket, for the retention sweep.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30

`prefix_stats`, `miss_stats` and `replica_stats` grow by a row per key and bucket for as long as traffic
flows; the planner now deletes buckets past `WARMPLANE_INGEST__STATS_RETENTION_HOURS`. Their primary
keys lead with the scope, so finding old buckets would scan each table. A BRIN index on `bucket` costs
the hot upsert path next to nothing (one summary per 128 pages, updated only when a page range's
bounds move) and fits these tables: rows arrive in bucket order, and only the current buckets are
updated, so each page range holds a narrow span of buckets.

The downgrade drops the indexes.
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_TABLES = ("prefix_stats", "miss_stats", "replica_stats")


def upgrade() -> None:
    for table in _TABLES:
        op.execute(f"CREATE INDEX {table}_bucket_brin ON {table} USING brin (bucket)")


def downgrade() -> None:
    for table in _TABLES:
        op.execute(f"DROP INDEX {table}_bucket_brin")
