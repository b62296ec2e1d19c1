"""Fleet reactions: the revisions a deploy bumped an epoch for, bumps to publish, cold-start alarms.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30

- `epochs` remembers the weights revision and prompt revisions of the deploy that last bumped the
  (tenant, model) (NULL when none did), so the same deploy seen again (its `finished` after its
  `started`, a redelivery) does not bump twice. A bump the planner makes itself is stored with the
  `epoch.bumped` event it publishes (`event`) and `published_at` once the broker took it, so a planner
  that stopped in between publishes it later.
- `cold_start_alarms`: one row per firing of a model's cold-start alarm (event-time window, counts, when
  it fired and cleared, how many replicas were planned again). At most one open alarm per model: the
  partial unique index lets one planner instance win the firing.
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE epochs
            ADD COLUMN model_revision text,
            ADD COLUMN prompt_revs    text[],
            ADD COLUMN event          jsonb,
            ADD COLUMN published_at   timestamptz
        """
    )
    op.execute(
        "CREATE INDEX epochs_unpublished ON epochs (bumped_at) WHERE event IS NOT NULL AND published_at IS NULL"
    )
    op.execute(
        """
        CREATE TABLE cold_start_alarms (
            alarm_id         uuid PRIMARY KEY,
            model            text   NOT NULL,
            window_start     timestamptz NOT NULL,
            window_end       timestamptz NOT NULL,
            requests         bigint NOT NULL,
            cold_requests    bigint NOT NULL,
            fired_at         timestamptz NOT NULL,
            replicas_planned integer NOT NULL DEFAULT 0,
            cleared_at       timestamptz
        )
        """
    )
    op.execute("COMMENT ON COLUMN cold_start_alarms.window_start IS 'event time: the first bucket judged'")
    op.execute(
        "CREATE UNIQUE INDEX cold_start_alarms_open ON cold_start_alarms (model) WHERE cleared_at IS NULL"
    )
    op.execute("CREATE INDEX cold_start_alarms_by_model ON cold_start_alarms (model, fired_at)")


def downgrade() -> None:
    op.execute("DROP TABLE cold_start_alarms")
    op.execute("DROP INDEX epochs_unpublished")
    op.execute(
        "ALTER TABLE epochs DROP COLUMN model_revision, DROP COLUMN prompt_revs, DROP COLUMN event, DROP COLUMN published_at"
    )
