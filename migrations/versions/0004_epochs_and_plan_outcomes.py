"""Epochs per (tenant, model), plan outcomes, and plans for several replicas from one trigger.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29

- `epochs` holds the current cache epoch of each (tenant, model), raised (never lowered) by
  `epoch.bumped` events in the same transaction as the batch that carries them. A (tenant, model)
  without a row is at epoch 0.
- An epoch bump plans every live replica of the model: one trigger, several plans. Issuing stays
  idempotent on (trigger, replica) instead of on the trigger alone.
- The warmers' results land on the plan's row: its state moves `issued` -> `warming` -> `verified`,
  `partial` or `failed`, with the counts and failures of `warm.finished`.

Downgrade keeps one plan per trigger (the earliest issued) so the old unique constraint holds.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE epochs (
            tenant     text   NOT NULL,
            model      text   NOT NULL,
            epoch      bigint NOT NULL CHECK (epoch >= 0),
            bumped_at  timestamptz NOT NULL,
            reason     text   NOT NULL DEFAULT '',
            event_id   uuid   NOT NULL,
            PRIMARY KEY (tenant, model)
        )
        """
    )
    op.execute("ALTER TABLE warm_plans DROP CONSTRAINT warm_plans_trigger_event_id_key")
    op.execute(
        "ALTER TABLE warm_plans ADD CONSTRAINT warm_plans_trigger_replica UNIQUE (trigger_event_id, replica_id)"
    )
    op.execute(
        """
        ALTER TABLE warm_plans
            ADD COLUMN items_done       integer,
            ADD COLUMN tokens_prefilled bigint,
            ADD COLUMN verified_hits    integer,
            ADD COLUMN failures         jsonb NOT NULL DEFAULT '[]',
            ADD COLUMN finished_at      timestamptz
        """
    )


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE warm_plans
            DROP COLUMN items_done, DROP COLUMN tokens_prefilled, DROP COLUMN verified_hits,
            DROP COLUMN failures, DROP COLUMN finished_at
        """
    )
    op.execute(
        """
        DELETE FROM warm_plans p USING warm_plans q
        WHERE p.trigger_event_id = q.trigger_event_id
          AND (p.issued_at, p.plan_id) > (q.issued_at, q.plan_id)
        """
    )
    op.execute("ALTER TABLE warm_plans DROP CONSTRAINT warm_plans_trigger_replica")
    op.execute(
        "ALTER TABLE warm_plans ADD CONSTRAINT warm_plans_trigger_event_id_key UNIQUE (trigger_event_id)"
    )
    op.execute("DROP TABLE epochs")
