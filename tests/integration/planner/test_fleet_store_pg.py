"""The fleet store's behaviour suite (`tests/fleet_store_behaviour.py`) on Postgres (`PgFleetStore`), each
behaviour on a fresh migrated database; a tenant's traffic is its scope, made as ingestion makes it. And
what only the adapter shows: the replicas an alarm planned, on its row."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.fleet_store_behaviour import AT, BEHAVIOURS, WINDOW, FleetWorld
from warmplane.services.planner.pg_fleet import PgFleetStore
from warmplane.services.planner.pg_store import PgIngestStore


@pytest.fixture
async def pool(migrated_database: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
async def test_the_postgres_fleet_store(behaviour: str, pool: asyncpg.Pool) -> None:
    ingest = PgIngestStore(pool, "planner", bucket_seconds=60)

    async def traffic(tenant: str, model: str) -> None:
        async with pool.acquire() as connection:
            await ingest.scope_ids(connection, {(tenant, model, "")})

    await BEHAVIOURS[behaviour](FleetWorld(PgFleetStore(pool), traffic))


async def test_an_alarm_row_keeps_the_replicas_it_planned(pool: asyncpg.Pool) -> None:
    store = PgFleetStore(pool)
    first = await store.open_alarm("m", window=WINDOW, requests=50, cold_requests=40, at=AT)
    assert first is not None
    await store.alarm_planned(first, 3)
    assert await store.clear_alarm("m", AT)
    assert await store.open_alarm("m", window=WINDOW, requests=9, cold_requests=9, at=AT) is not None
    rows = await pool.fetch(
        "SELECT replicas_planned, cleared_at IS NULL FROM cold_start_alarms WHERE model = 'm' "
        "ORDER BY cleared_at NULLS LAST"
    )
    assert [tuple(row) for row in rows] == [(3, False), (0, True)]
