"""The plan store's behaviour suite (`tests/plan_store_behaviour.py`) on Postgres (`PgPlanStore`), each
behaviour on a fresh migrated database."""

from __future__ import annotations

import asyncpg
import pytest

from tests.plan_store_behaviour import BEHAVIOURS
from warmplane.services.planner.pg_plans import PgPlanStore


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
async def test_the_postgres_plan_store(behaviour: str, migrated_database: str) -> None:
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:
        await BEHAVIOURS[behaviour](PgPlanStore(pool))
    finally:
        await pool.close()
