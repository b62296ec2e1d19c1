"""When each replica was last heard from: `replicas.heard_at`.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03

A replica whose node is lost says nothing: no drain, no stop. Its warmer's heartbeats (`replica.heartbeat`)
stop instead. The planner keeps the newest moment it heard a replica (a heartbeat, or any lifecycle event
of its warmer) and marks a live replica lost when that moment falls a timeout behind the rest of the fleet's
(`services/planner/liveness.py`). Existing rows start as heard when their state began. The downgrade drops
the column.
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE replicas ADD COLUMN heard_at timestamptz")
    op.execute("UPDATE replicas SET heard_at = state_since")


def downgrade() -> None:
    op.execute("ALTER TABLE replicas DROP COLUMN heard_at")
