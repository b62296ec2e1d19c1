"""The ingest store's behaviour suite (`tests/ingest_store_behaviour.py`) on Postgres (`PgIngestStore`, read
back through `PgPlanStore`), each behaviour on a fresh migrated database."""

from __future__ import annotations

import asyncpg
import pytest

from tests.ingest_store_behaviour import BEHAVIOURS, BUCKET_SECONDS, IngestWorld
from warmplane.services.planner.pg_plans import PgPlanStore
from warmplane.services.planner.pg_store import PgIngestStore


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
async def test_the_postgres_ingest_store(behaviour: str, migrated_database: str) -> None:
    pool = await asyncpg.create_pool(
        migrated_database, min_size=1, max_size=2, init=PgIngestStore.prepare_session
    )
    try:
        store = PgIngestStore(pool, "planner", BUCKET_SECONDS)
        await BEHAVIOURS[behaviour](IngestWorld(store, PgPlanStore(pool)))
    finally:
        await pool.close()
