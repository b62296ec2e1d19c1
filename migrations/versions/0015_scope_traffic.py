"""`scope_traffic`: request sums per scope and bucket, kept for the API's history once the per-prefix
detail is gone.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06

A plan reads every chain node of the model's scopes with traffic in its window (`PgPlanStore.statistics`),
and `prefix_paths` kept a chain for as long as a `prefix_stats` row named one of its prefixes: 31 days.
In chat traffic, where almost every request adds nodes, a plan's read grew with that retention, reading
many times the nodes it needs (`python -m bench.statistics_read_bench`). Plans weigh only
the last `WARMPLANE_PLANS__WINDOW_HOURS`; the 30 days are for the API's traffic view, which sums per
tenant and model and never needed the prefix.

So per-prefix request statistics are now kept for `WARMPLANE_INGEST__DETAIL_RETENTION_HOURS` (25 h), and
the sweep moves older buckets into this table, summed per scope, in the statement that deletes them
(`services/planner/pg_retention.py`): a request is counted in exactly one of the two tables at any
moment. The path sweep follows the detail's cut, so the chains a plan reads span about a day whatever the
retention. This table keeps `WARMPLANE_INGEST__STATS_RETENTION_HOURS` (31 days) like `miss_stats` and
`replica_stats`; a row a scope a bucket.

The downgrade drops the table: the sums it held of buckets older than the detail's cut are lost.
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE scope_traffic (
            scope_id      integer NOT NULL,
            bucket        bigint  NOT NULL,
            requests      bigint  NOT NULL DEFAULT 0,
            cold_requests bigint  NOT NULL DEFAULT 0,
            prompt_tokens bigint  NOT NULL DEFAULT 0,
            cached_tokens bigint  NOT NULL DEFAULT 0,
            ttft_ms_sum   double precision NOT NULL DEFAULT 0,
            ttft_count    bigint  NOT NULL DEFAULT 0,
            PRIMARY KEY (scope_id, bucket)
        )
        """
    )
    op.execute(
        "COMMENT ON TABLE scope_traffic IS"
        " 'prefix_stats summed per scope, for buckets past the detail retention (moved by the sweep)'"
    )
    op.execute("CREATE INDEX scope_traffic_bucket_brin ON scope_traffic USING brin (bucket)")


def downgrade() -> None:
    op.execute("DROP TABLE scope_traffic")
