"""Plans remember whether the broker took them, and the event they were published as.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29

A plan is recorded before it is published. `published_at` is set once the broker acknowledged it, so a
planner can publish again, byte for byte from `event`, a plan whose publication failed or was cut short
by a crash (the warmer applies a plan once, by id, so a second copy is harmless).
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE warm_plans ADD COLUMN published_at timestamptz, ADD COLUMN event jsonb")
    op.execute("CREATE INDEX warm_plans_unpublished ON warm_plans (issued_at) WHERE published_at IS NULL")
    op.execute(
        "CREATE INDEX replica_transitions_starts ON replica_transitions (occurred_at) WHERE state = 'starting'"
    )


def downgrade() -> None:
    op.execute("DROP INDEX replica_transitions_starts")
    op.execute("DROP INDEX warm_plans_unpublished")
    op.execute("ALTER TABLE warm_plans DROP COLUMN published_at, DROP COLUMN event")
