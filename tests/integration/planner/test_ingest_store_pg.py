"""The ingest store's behaviour suite (`tests/ingest_store_behaviour.py`) on Postgres (`PgIngestStore`, read
back through `PgPlanStore`), each behaviour on a fresh migrated database."""

from __future__ import annotations

import asyncio

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


async def test_a_scope_another_planner_creates_meanwhile_is_read_once_its_insert_commits(
    migrated_database: str,
) -> None:
    """Two planners meeting a new tenant at once: one's insert waits for the other's, does nothing, and
    its snapshot predates the other's commit. It must still learn the id (the writer died on a KeyError)."""
    scope = ("acme", "m", "")
    other = await asyncpg.connect(migrated_database)
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:
        meanwhile = other.transaction()
        await meanwhile.start()
        created = await other.fetchval(
            "INSERT INTO scopes (tenant, model, prompt_rev) VALUES ($1, $2, $3) RETURNING scope_id", *scope
        )
        store = PgIngestStore(pool, "planner", BUCKET_SECONDS)
        async with pool.acquire() as connection:
            asking = asyncio.create_task(store.scope_ids(connection, {scope}))
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            while not await pool.fetchval(waiting):  # noqa: ASYNC110 - Postgres's lock waits send no event
                await asyncio.sleep(0.01)
            await meanwhile.commit()
            assert await asyncio.wait_for(asking, 10) == {scope: created}
    finally:
        await other.close()
        await pool.close()
