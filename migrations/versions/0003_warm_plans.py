"""Warm plans: one row per plan the planner issued, unique on the lifecycle event that triggered it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

`trigger_event_id` is UNIQUE so that issuing is idempotent: a redelivered `replica.started` inserts
nothing and publishes nothing. `items` holds the plan's `WarmItem`s as the contract encodes them, so an
issued plan can be published again from its row alone.
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE warm_plans (
            plan_id          uuid PRIMARY KEY,
            replica_id       text   NOT NULL,
            node             text   NOT NULL,
            model            text   NOT NULL,
            epoch            bigint NOT NULL,
            state            text   NOT NULL CHECK (state IN
                               ('issued','warming','verified','partial','failed','superseded')),
            items            jsonb  NOT NULL,
            budget_tokens    bigint NOT NULL,
            deadline         timestamptz NOT NULL,
            issued_at        timestamptz NOT NULL,
            trigger_event_id uuid   NOT NULL UNIQUE
        )
        """
    )
    op.execute("CREATE INDEX warm_plans_by_replica ON warm_plans (replica_id, issued_at)")


def downgrade() -> None:
    op.execute("DROP TABLE warm_plans")
