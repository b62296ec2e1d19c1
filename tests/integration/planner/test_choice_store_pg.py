"""The choice store's behaviour suite (`tests/choice_store_behaviour.py`) on Postgres (`PgPlanStore`), each
behaviour on a fresh migrated database, seeded through `PgIngestStore`'s write as ingestion seeds it."""

from __future__ import annotations

import asyncpg
import pytest

from tests.choice_store_behaviour import BEHAVIOURS, MINUTE, ChoiceWorld
from tests.ingest_store_behaviour import AT, BUCKET, BUCKET_SECONDS
from warmplane.services.planner.core.ingest_batch import fold_events
from warmplane.services.planner.pg_plans import PgPlanStore
from warmplane.services.planner.pg_store import PgIngestStore
from warmplane.services.planner.policy import StoredPrefix
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


async def test_a_chain_anchored_in_a_newer_row_is_read_whole_and_a_swept_anchor_ends_it(
    migrated_database: str,
) -> None:
    """The read streams rows newest first (`core/chains_read.py`): an anchor in a row newer than the one
    anchored at it (a late event's row) is looked up again; one no row holds ends the chain there."""
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=1)
    try:
        scope = await pool.fetchval(
            "INSERT INTO scopes (tenant, model, prompt_rev) VALUES ('acme', 'm', '') RETURNING scope_id"
        )
        await pool.executemany(
            """INSERT INTO prefix_paths (scope_id, leaf_id, anchor_id, first_depth, ids, tokens, first_seen)
               VALUES ($1, $2, $3, $4, $5, $6, $7)""",
            [
                (scope, 7, None, 0, [1, 7], [16, 32], AT),
                (scope, 11, 7, 2, [11], [48], AT - MINUTE),
                (scope, 13, 12, 5, [13], [96], AT - MINUTE),  # 12's row is gone
            ],
        )
        await pool.executemany(
            "INSERT INTO prefix_stats (scope_id, prefix_id, bucket, requests) VALUES ($1, $2, $3, 1)",
            [(scope, 11, BUCKET), (scope, 13, BUCKET)],
        )
        stats = await PgPlanStore(pool).statistics("m", BUCKET)
        assert sorted((prefix for _scope, prefix in stats.prefixes), key=lambda p: p.prefix_id) == [
            StoredPrefix(1, None, 16), StoredPrefix(7, 1, 32), StoredPrefix(11, 7, 48),
            StoredPrefix(13, 12, 96),
        ]  # fmt: skip
    finally:
        await pool.close()
