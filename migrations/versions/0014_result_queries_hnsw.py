"""An HNSW index (cosine) for the semantic result tier's all-MiniLM-L6-v2 vectors.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04

Migration 0008 left `result_queries` to exact search: the btree on (tenant, model, epoch, space, context)
narrows the rows, and each is compared. That stays right for a small namespace; for a large one (tens of
thousands of queries under one context) comparing every row costs milliseconds a lookup. HNSW needs a fixed
dimension, and the `embedding` column has none (each vector space may have its own), so the index is on
the cast to the space's dimension and partial to that space: `all-minilm-l6-v2`, 384 dimensions
(`services/gateway/embedders.py`). The gateway's search in that space (`result_stores.nearest_query`) orders
by the same expression, with iterative scans so the namespace's rows are found past other namespaces'; the
planner chooses between this index and the btree. Other spaces keep exact search. The downgrade drops it.
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE INDEX result_queries_minilm_hnsw ON result_queries
        USING hnsw ((embedding::vector(384)) vector_cosine_ops)
        WHERE space = 'all-minilm-l6-v2'
        """
    )


def downgrade() -> None:
    op.execute("DROP INDEX result_queries_minilm_hnsw")
