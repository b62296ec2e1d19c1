"""What each replica holds by its warmer's latest `replica.residency` report.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30

One row per replica: its latest report, which replaces the whole of the previous one. `incarnation` is
the event id of the `replica.started` the report belongs to; readers use the row only while that is the
replica's latest start. `held` is the report's `held` as the contract encodes it (`[[tenant,
prompt_rev, epoch, [prefix ids]], ...]`), `held_count` the number of prefix ids in it. `occurred_at` is
the warmer's clock, the same clock as a plan's `finished_at`, so the two can be ordered. The planner
writes a row in its batch's transaction, and keeps the newer report by (`occurred_at`, `event_id`): a
redelivered or late report changes nothing.

The downgrade drops the table; no other object depends on it.
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE replica_residency (
            replica_id  text        PRIMARY KEY,
            incarnation uuid        NOT NULL,
            event_id    uuid        NOT NULL,
            occurred_at timestamptz NOT NULL,
            held        jsonb       NOT NULL,
            held_count  integer     NOT NULL,
            lost        integer     NOT NULL,
            complete    boolean     NOT NULL
        )
        """
    )
    op.execute(
        "COMMENT ON COLUMN replica_residency.incarnation IS 'event id of the replica.started it reports on'"
    )


def downgrade() -> None:
    op.execute("DROP TABLE replica_residency")
