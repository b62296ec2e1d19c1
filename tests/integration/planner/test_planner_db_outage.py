"""PostgreSQL stopped mid-stream, under a running planner, and started again (issue 21's fault suite): the
planner rides the outage out, commits no offset while the database is away, and counts every event exactly
once. Postgres here is a server of the test's own (the session's serves the other tests)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from tests.integration.planner.ingest_stream import (
    COUNTED,
    assert_counted_once,
    committed_offsets,
    drained,
    retried_stream,
)
from tests.integration.planner_harness import poll_until, produce, start_planner_process
from tests.real_parts import fresh_database, planner_settings_for
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres

EVENTS = 60_000
RETRYING = "Postgres unreachable"


@pytest.fixture
async def own_postgres(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedPostgres, str]]:
    """A server this test may stop, with a migrated database; its asyncpg DSN."""
    with EmbeddedPostgres(tmp_path / "postgres") as postgres:
        async with fresh_database(postgres) as dsn:
            yield postgres, dsn


async def test_postgres_stopped_mid_stream_loses_nothing_and_commits_nothing_early(
    embedded_kafka: EmbeddedKafka, own_postgres: tuple[EmbeddedPostgres, str], tmp_path: Path
) -> None:
    postgres, dsn = own_postgres
    base = planner_settings_for(embedded_kafka.bootstrap_servers, dsn)
    settings = base.model_copy(
        update={"ingest": base.ingest.model_copy(update={"batch_max_records": 1_000, "db_outage_s": 120.0})}
    )
    stream = retried_stream(seed=11, count=EVENTS)
    await produce(settings.kafka, stream.events)
    log = tmp_path / "planner.log"
    planner = start_planner_process(settings, log)
    try:
        db = await asyncpg.connect(dsn)
        try:

            async def some_counted() -> bool:
                return bool(await db.fetchval(COUNTED) >= stream.total // 5)

            await poll_until(some_counted, timeout_s=60, what="a fifth of the stream counted")
        finally:
            await db.close()
        await asyncio.to_thread(postgres.stop)  # a fast shutdown: the batch in flight is cut off

        async def retried(times: int) -> bool:
            return log.read_text(errors="replace").count(RETRYING) >= times

        await poll_until(lambda: retried(1), timeout_s=30, what="the planner to find Postgres gone")
        while_down = await committed_offsets(settings)
        await poll_until(lambda: retried(3), timeout_s=30, what="the planner to try again, twice")
        assert planner.poll() is None, log.read_text()[-3000:]
        assert await committed_offsets(settings) == while_down, "an offset committed with Postgres away"

        await asyncio.to_thread(postgres.start)
        db = await asyncpg.connect(dsn)
        try:
            assert await db.fetchval(COUNTED) < stream.total, "the stream was counted before the outage"
            await poll_until(
                lambda: drained(db, settings, stream), timeout_s=120, what="the planner to drain the stream"
            )
            assert planner.poll() is None, "the planner rode the outage out"
            await assert_counted_once(db, stream)
        finally:
            await db.close()
    finally:
        planner.send_signal(signal.SIGTERM)
        assert planner.wait(30) == 0, log.read_text()[-3000:]
