"""The choice store's behaviour suite (`tests/choice_store_behaviour.py`) on Postgres (`PgPlanStore`), each
behaviour on a fresh migrated database, seeded through `PgIngestStore`'s write as ingestion seeds it."""

from __future__ import annotations

from datetime import datetime

import asyncpg
import pytest

from tests.choice_store_behaviour import BEHAVIOURS, MINUTE, ChoiceWorld
from tests.ingest_store_behaviour import AT, BUCKET, BUCKET_SECONDS
from warmplane.services.planner.core.ingest_batch import fold_events
from warmplane.services.planner.pg_plans import PgPlanStore
from warmplane.services.planner.pg_store import PgIngestStore
from warmplane.services.planner.policy import StoredPrefix
from warmplane.shared.chain_nodes import pack_runs
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


async def test_the_read_and_the_nodes_view_agree_on_stored_chains_and_a_swept_parent_ends_one(
    migrated_database: str,
) -> None:
    """A plan's read unpacks the chain rows in Python (`core/chains_read.py`), SQL through
    `warmplane_chain_nodes` (the `prefix_nodes` view): both give the nodes as stored, the oldest row's where
    one is stored twice; a node whose parent's row went (swept) ends its chain there."""
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=1)
    try:
        scope = await pool.fetchval(
            "INSERT INTO scopes (tenant, model, prompt_rev) VALUES ('acme', 'm', '') RETURNING scope_id"
        )
        top, bottom = 2**63 - 1, -(2**63)  # ids are any 64-bit value
        Run = tuple[int | None, int, list[int], list[int]]
        rows: list[tuple[datetime, list[Run]]] = [
            (AT - 2 * MINUTE, [(None, 0, [1, top], [16, 32])]),
            (AT - MINUTE, [(top, 2, [11, bottom], [48, 2**31 - 1]), (12, 5, [13], [96])]),  # 12: swept
            (AT, [(None, 0, [1, top], [16, 33])]),  # written again, newer: the older row's tokens stand
        ]
        await pool.executemany(
            "INSERT INTO prefix_chains (scope_id, written_at, nodes) VALUES ($1, $2, $3)",
            [(scope, at, pack_runs(runs)) for at, runs in rows],
        )
        await pool.executemany(
            "INSERT INTO prefix_stats (scope_id, prefix_id, bucket, requests) VALUES ($1, $2, $3, 1)",
            [(scope, bottom, BUCKET), (scope, 13, BUCKET)],
        )
        stored = [
            StoredPrefix(1, None, 16), StoredPrefix(top, 1, 32), StoredPrefix(11, top, 48),
            StoredPrefix(bottom, 11, 2**31 - 1), StoredPrefix(13, 12, 96),
        ]  # fmt: skip
        stats = await PgPlanStore(pool).statistics("m", BUCKET)
        assert sorted((p for _s, p in stats.prefixes), key=lambda p: p.prefix_id) == sorted(
            stored, key=lambda p: p.prefix_id
        )
        viewed = await pool.fetch("SELECT prefix_id, parent_id, tokens, depth FROM prefix_nodes ORDER BY 1")
        assert [StoredPrefix(r[0], r[1], r[2]) for r in viewed] == sorted(stored, key=lambda p: p.prefix_id)
        assert {r[0]: r[3] for r in viewed} == {bottom: 3, 1: 0, 11: 2, 13: 5, top: 1}
    finally:
        await pool.close()
