"""The gateway's semantic result cache: query vectors that point at answers kept in Redis.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30

`result_queries` holds, per (tenant, model, epoch, vector space, request context), the embedding of a
query whose answer Redis keeps under `answer_key`. The gateway searches it exactly (pgvector's cosine
distance over the rows the btree narrows to), never across tenants, epochs or contexts. Rows expire
with their answers (`expires_at`) and are swept by the gateway. Needs the pgvector extension (the
embedded PostgreSQL ships it; a managed Postgres must allow `CREATE EXTENSION vector`). The `vector`
column has no fixed dimension, so a different embedder (another `space`) needs no migration.
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.execute(
        """
        CREATE TABLE result_queries (
            tenant     text        NOT NULL,
            model      text        NOT NULL,
            epoch      bigint      NOT NULL,
            space      text        NOT NULL,
            context    bytea       NOT NULL,
            embedding  vector      NOT NULL,
            answer_key text        NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz NOT NULL
        )
        """
    )
    op.execute("CREATE INDEX result_queries_scope ON result_queries (tenant, model, epoch, space, context)")
    op.execute("CREATE INDEX result_queries_expiry ON result_queries (expires_at)")
    # One row per answer and vector space: the same answer kept twice (two misses in flight, a
    # `no-cache` refresh) renews its row rather than adding one.
    op.execute("CREATE UNIQUE INDEX result_queries_answer ON result_queries (answer_key, space)")


def downgrade() -> None:
    # The extension stays: other schemas on the server may use it, and dropping it is not ours to do.
    op.execute("DROP TABLE result_queries")
