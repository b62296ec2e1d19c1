"""The choice store's behaviour suite (`tests/choice_store_behaviour.py`) on Postgres (`PgPlanStore`), each
behaviour on a fresh migrated database, seeded through `PgIngestStore`'s write as ingestion seeds it."""

from __future__ import annotations

import asyncpg
import pytest

from tests.choice_store_behaviour import BEHAVIOURS, ChoiceWorld
from tests.ingest_store_behaviour import BUCKET_SECONDS
from warmplane.services.planner.core.ingest_batch import fold_events
from warmplane.services.planner.pg_plans import PgPlanStore
from warmplane.services.planner.pg_store import PgIngestStore
from warmplane.shared.events import Event


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
async def test_the_postgres_choice_store(behaviour: str, migrated_database: str) -> None:
    pool = await asyncpg.create_pool(
        migrated_database, min_size=1, max_size=2, init=PgIngestStore.prepare_session
    )
    ingest = PgIngestStore(pool, "planner", BUCKET_SECONDS)

    async def write(events: list[Event]) -> None:
        await ingest.write([], fold_events(events, stored_nodes={}))

    try:
        await BEHAVIOURS[behaviour](ChoiceWorld(PgPlanStore(pool), write))
    finally:
        await pool.close()
