"""Migrations on real Postgres: upgrade, downgrade to nothing, upgrade again; the start-up schema check."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from warmplane.shared import migrate
from warmplane.shared.embedded import EmbeddedPostgres
from warmplane.shared.schema_check import SchemaNotReady, head_revision, require_schema_at_head

PLANNER_TABLES = {
    "ingest_offsets",
    "ingest_ledger",
    "scopes",
    "prefix_stats",
    "miss_stats",
    "prefix_chains",
    "prefix_catalog",
    "replicas",
    "replica_transitions",
    "fleet_changes",
    "warm_plans",
    "replica_stats",
    "replica_residency",
}
_TIMEOUT_S = 10.0


@pytest.fixture
async def empty_database(embedded_postgres: EmbeddedPostgres) -> AsyncIterator[str]:
    """A fresh, un-migrated database on the session's server; its asyncpg DSN. Dropped after."""
    name = f"wp_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(embedded_postgres.asyncpg_dsn, timeout=_TIMEOUT_S)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield embedded_postgres.asyncpg_dsn.rsplit("/", 1)[0] + f"/{name}"
    admin = await asyncpg.connect(embedded_postgres.asyncpg_dsn, timeout=_TIMEOUT_S)
    try:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def sqlalchemy_url(dsn: str) -> str:
    return "postgresql+asyncpg://" + dsn.split("://", 1)[1]


async def migrate_to(dsn: str, revision: str, *, down: bool = False) -> None:
    """Upgrade to `revision`, or downgrade to it (`base` always goes down)."""
    if down or revision == "base":
        await asyncio.to_thread(migrate.downgrade, sqlalchemy_url(dsn), revision)
    else:
        await asyncio.to_thread(migrate.upgrade, sqlalchemy_url(dsn), revision)


async def relations(db: asyncpg.Connection) -> set[str]:
    """Every table, index, sequence and view in the public schema."""
    rows = await db.fetch(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i', 'S', 'v', 'm', 'p')"
    )
    return {row["relname"] for row in rows}


async def columns(db: asyncpg.Connection) -> list[tuple[str, ...]]:
    rows = await db.fetch(
        "SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, '')"
        " FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2"
    )
    return [tuple(row) for row in rows]


async def ingest_function(db: asyncpg.Connection) -> str:
    """The definition of `warmplane_ingest_events` as Postgres holds it (looked up by name on every
    call: a migration recreates it under a new oid, and a cached `::regproc` plan would keep the old)."""
    definition: str = await db.fetchval(
        "SELECT pg_get_functiondef(oid) FROM pg_proc WHERE proname = 'warmplane_ingest_events'"
    )
    return definition


async def test_upgrade_downgrade_upgrade(empty_database: str) -> None:
    db = await asyncpg.connect(empty_database, timeout=_TIMEOUT_S)
    try:
        assert await relations(db) == set()

        await migrate_to(empty_database, "head")
        first = await relations(db)
        assert first >= PLANNER_TABLES | {"alembic_version"}
        assert await db.fetchval("SELECT version_num FROM alembic_version") == head_revision()
        first_columns = await columns(db)

        await migrate_to(empty_database, "base")
        assert await relations(db) == {"alembic_version", "alembic_version_pkc"}
        assert await db.fetchval("SELECT count(*) FROM alembic_version") == 0

        await migrate_to(empty_database, "head")
        assert await relations(db) == first
        assert await columns(db) == first_columns
        assert await db.fetchval("SELECT version_num FROM alembic_version") == head_revision()
    finally:
        await db.close()


async def test_0009_down_restores_the_0006_ingest_function_and_up_again_the_replica_sums(
    empty_database: str,
) -> None:
    """Downgrading past 0009 drops `replica_stats` and puts back the function 0006 made (which sums no
    replicas); upgrading again restores 0009's exactly."""
    db = await asyncpg.connect(empty_database, timeout=_TIMEOUT_S)
    try:
        await migrate_to(empty_database, "0008")
        before, before_relations = await ingest_function(db), await relations(db)
        assert "replica_stats" not in before and "replica_stats" not in before_relations

        await migrate_to(empty_database, "0009")
        at_0009 = await ingest_function(db)
        assert "INSERT INTO replica_stats" in at_0009
        assert await relations(db) - before_relations == {"replica_stats", "replica_stats_pkey"}

        await migrate_to(empty_database, "0008", down=True)
        assert await ingest_function(db) == before
        assert await relations(db) == before_relations

        await migrate_to(empty_database, "0009")
        assert await ingest_function(db) == at_0009
    finally:
        await db.close()


async def test_0012_adds_and_drops_exactly_the_path_retention_indexes(empty_database: str) -> None:
    db = await asyncpg.connect(empty_database, timeout=_TIMEOUT_S)
    try:
        await migrate_to(empty_database, "0011")
        before = await relations(db)
        await migrate_to(empty_database, "0012")
        assert await relations(db) - before == {"prefix_paths_first_seen_brin", "prefix_paths_anchor"}
        await migrate_to(empty_database, "0011", down=True)
        assert await relations(db) == before
    finally:
        await db.close()


async def test_0016_carries_the_stored_chains_over_and_back(empty_database: str) -> None:
    """Path rows become packed chain rows and back: the `prefix_nodes` view reads the same nodes at 0015,
    at 0016 and after the downgrade."""
    nodes = "SELECT scope_id, prefix_id, parent_id, depth, tokens FROM prefix_nodes ORDER BY 1, 2"
    db = await asyncpg.connect(empty_database, timeout=_TIMEOUT_S)
    try:
        await migrate_to(empty_database, "0015")
        await db.executemany(
            "INSERT INTO prefix_paths (scope_id, leaf_id, anchor_id, first_depth, ids, tokens, first_seen)"
            " VALUES ($1, $2, $3, $4, $5, $6, now())",
            [
                (1, 3, None, 0, [1, 2, 3], [16, 32, 48]),
                (1, 5, 2, 2, [4, 5], [40, 56]),
                (2, -(2**63), None, 0, [2**63 - 1, -(2**63)], [7, 9]),
            ],
        )
        before = [tuple(row) for row in await db.fetch(nodes)]
        assert len(before) == 7
        await migrate_to(empty_database, "0016")
        assert [tuple(row) for row in await db.fetch(nodes)] == before
        assert await db.fetchval("SELECT count(*) FROM prefix_chains") == 3
        await migrate_to(empty_database, "0015", down=True)
        assert [tuple(row) for row in await db.fetch(nodes)] == before
    finally:
        await db.close()


async def test_0017_puts_the_leaves_counted_with_chains_back_into_prefix_stats(empty_database: str) -> None:
    """At 0017 a leaf's requests are its `prefix_stats` rows plus its chain rows' entries; the downgrade moves
    the entries into `prefix_stats` and as many requests out of `scope_traffic`: every total stays."""
    requests = "SELECT scope_id, prefix_id, bucket, requests FROM prefix_requests ORDER BY 1, 2, 3"
    traffic = "SELECT (SELECT sum(requests) FROM prefix_stats) + (SELECT sum(requests) FROM scope_traffic)"
    entries = b"".join(
        leaf.to_bytes(8, "big", signed=True) + bucket.to_bytes(8, "big", signed=True)
        for leaf, bucket in [(3, 10), (3, 10), (-(2**63), 11), (2**63 - 1, 10)]
    )
    db = await asyncpg.connect(empty_database, timeout=_TIMEOUT_S)
    try:
        await migrate_to(empty_database, "0017")
        await db.execute("INSERT INTO prefix_chains (scope_id, nodes, leaves) VALUES (1, '', $1)", entries)
        await db.execute(
            "INSERT INTO prefix_stats (scope_id, prefix_id, bucket, requests) VALUES (1, 3, 10, 5)"
        )
        await db.execute(
            "INSERT INTO scope_traffic (scope_id, bucket, requests) VALUES (1, 10, 3), (1, 11, 1)"
        )
        counted = [tuple(row) for row in await db.fetch(requests)]
        assert counted == [(1, -(2**63), 11, 1), (1, 3, 10, 7), (1, 2**63 - 1, 10, 1)]
        assert await db.fetchval(traffic) == 9
        await migrate_to(empty_database, "0016", down=True)
        stats = "SELECT scope_id, prefix_id, bucket, requests FROM prefix_stats ORDER BY 1, 2, 3"
        assert [tuple(row) for row in await db.fetch(stats)] == counted
        assert await db.fetchval("SELECT sum(requests) FROM scope_traffic") == 0
        assert await db.fetchval(traffic) == 9
    finally:
        await db.close()


async def test_a_migrated_database_accepts_the_planner_rows(empty_database: str) -> None:
    """Smoke the constraints the store relies on: identity scope ids, upsert keys, the state check."""
    await migrate_to(empty_database, "head")
    db = await asyncpg.connect(empty_database, timeout=_TIMEOUT_S)
    try:
        scope_id = await db.fetchval(
            "INSERT INTO scopes (tenant, model, prompt_rev) VALUES ('acme', 'm', '') RETURNING scope_id"
        )
        await db.execute(
            "INSERT INTO prefix_stats (scope_id, prefix_id, bucket, requests) VALUES ($1, $2, 1, 1)",
            scope_id,
            -(2**63),
        )
        with pytest.raises(asyncpg.UniqueViolationError):
            await db.execute(
                "INSERT INTO prefix_stats (scope_id, prefix_id, bucket) VALUES ($1, $2, 1)",
                scope_id,
                -(2**63),
            )
        with pytest.raises(asyncpg.CheckViolationError):
            await db.execute(
                "INSERT INTO replicas (replica_id, node, model, model_revision, endpoint, state, state_since,"
                " last_event_id) VALUES ('r', 'n', 'm', '', '', 'confused', now(), $1)",
                uuid.uuid4(),
            )
        with pytest.raises(asyncpg.CheckViolationError):
            await db.execute(
                "INSERT INTO warm_plans (plan_id, replica_id, node, model, epoch, state, items,"
                " budget_tokens, deadline, issued_at, trigger_event_id)"
                " VALUES ($1, 'r', 'n', 'm', 0, 'unsure', '[]', 1, now(), now(), $1)",
                uuid.uuid4(),
            )
    finally:
        await db.close()


async def test_schema_check_refuses_a_database_not_at_head(empty_database: str) -> None:
    pool = await asyncpg.create_pool(empty_database, min_size=1, max_size=1, timeout=_TIMEOUT_S)
    try:
        with pytest.raises(SchemaNotReady, match=f"at nothing, this planner needs {head_revision()}"):
            await require_schema_at_head(pool)

        await migrate_to(empty_database, "head")
        await require_schema_at_head(pool)

        await migrate_to(empty_database, "base")
        with pytest.raises(SchemaNotReady, match="warmplane migrate"):
            await require_schema_at_head(pool)
    finally:
        await pool.close()


async def test_migrations_started_together_migrate_once_and_all_succeed(empty_database: str) -> None:
    """As planner pods of one release do in their init containers: `warmplane migrate` in several processes
    at once. The migration lock lets one migrate; the others wait for it and find the schema at head."""
    environment = {**os.environ, "WARMPLANE_POSTGRES__URL": empty_database}
    processes = [
        await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("warmplane")),
            "migrate",
            env=environment,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        for _ in range(3)
    ]
    async with asyncio.timeout(120):
        outputs = [(await process.communicate())[0].decode() for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], outputs
    connection = await asyncpg.connect(empty_database, timeout=_TIMEOUT_S)
    try:
        assert await connection.fetchval("SELECT version_num FROM alembic_version") == head_revision()
        tables = {row[0] for row in await connection.fetch("SELECT tablename FROM pg_tables")}
    finally:
        await connection.close()
    assert tables >= PLANNER_TABLES
