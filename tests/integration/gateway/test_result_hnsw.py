"""The semantic tier's HNSW index (migration 0014) on real Postgres with pgvector: it exists with cosine
ops, the MiniLM space's search can use it, and through it a small namespace's nearest row is still found
among many rows of other namespaces (iterative scans)."""

from __future__ import annotations

import random

import asyncpg
import pytest

from warmplane.services.gateway.embedders import MINILM_SPACE
from warmplane.services.gateway.result_keys import Namespace
from warmplane.services.gateway.result_stores import HNSW_SPACES, PgQueryIndex, QueryScope, nearest_query
from warmplane.services.gateway.text_embedding import cosine

DIMENSIONS = HNSW_SPACES[MINILM_SPACE]


def unit(rng: random.Random) -> list[float]:
    return normal([rng.gauss(0, 1) for _ in range(DIMENSIONS)])


def normal(vector: list[float]) -> list[float]:
    norm = sum(x * x for x in vector) ** 0.5
    return [x / norm for x in vector]


def near(center: list[float], spread: float, rng: random.Random) -> list[float]:
    """A unit vector about `spread` (relative to the unit) away from `center`."""
    return normal([x + spread * y for x, y in zip(center, unit(rng), strict=True)])


async def test_the_minilm_space_is_searched_through_a_cosine_hnsw_index(migrated_database: str) -> None:
    admin = await asyncpg.connect(migrated_database)
    try:
        definition = await admin.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'result_queries_minilm_hnsw'"
        )
        assert "USING hnsw" in definition and "vector_cosine_ops" in definition
        # Left with the HNSW index or a full scan, the planner must take the index.
        await admin.execute("DROP INDEX result_queries_scope")
        database = await admin.fetchval("SELECT current_database()")
        await admin.execute(f'ALTER DATABASE "{database}" SET enable_seqscan = off')
    finally:
        await admin.close()

    rng = random.Random(20)
    ours = QueryScope(Namespace("acme", "m", 1), MINILM_SPACE, b"context")
    others = QueryScope(Namespace("globex", "m", 1), MINILM_SPACE, b"context")
    asked = unit(rng)
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:
        index = PgQueryIndex(pool)
        # Another namespace crowds the query's neighbourhood: its 400 rows are all nearer than any of ours,
        # so a search that stopped at the first candidates would find nothing of ours.
        for i in range(400):
            await index.add(others, near(asked, 0.3, rng), f"globex-{i}", 600)
        mine = [near(asked, spread, rng) for spread in (3.0, 1.5, 4.0)]
        for i, vector in enumerate(mine):
            await index.add(ours, vector, f"acme-{i}", 600)

        found = await index.nearest(ours, asked)
        assert found is not None and found[0] == "acme-1", found
        assert found[1] == pytest.approx(cosine(asked, mine[1]), abs=1e-4)
        async with pool.acquire() as connection:
            await connection.execute("SET hnsw.iterative_scan = strict_order")
            literal = "[" + ",".join(map(repr, asked)) + "]"
            plan = await connection.fetch(
                "EXPLAIN " + nearest_query(MINILM_SPACE), *ours.parameters(), literal
            )
        assert "result_queries_minilm_hnsw" in "\n".join(row[0] for row in plan)
    finally:
        await pool.close()
