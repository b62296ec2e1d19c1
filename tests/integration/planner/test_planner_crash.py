"""A planner killed (SIGKILL, a real process) mid-stream and restarted counts every event exactly once."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import asyncpg

from tests.integration.planner.ingest_stream import COUNTED, assert_counted_once, drained, retried_stream
from tests.integration.planner_harness import poll_until, produce, start_planner_process
from warmplane.services.planner.settings import IngestSettings, PlannerSettings

EVENTS = 120_000


async def test_sigkill_mid_batch_neither_loses_nor_double_counts(
    planner_settings: PlannerSettings, tmp_path: Path
) -> None:
    settings = planner_settings.model_copy(
        update={"ingest": IngestSettings(group_id=planner_settings.ingest.group_id, batch_max_records=1_000)}
    )
    stream = retried_stream(seed=7, count=EVENTS)
    await produce(settings.kafka, stream.events)
    db = await asyncpg.connect(settings.postgres.asyncpg_dsn())
    try:
        first = start_planner_process(settings, tmp_path / "planner-1.log")
        try:

            async def some_counted() -> bool:
                return bool(await db.fetchval(COUNTED) >= stream.total // 5)

            await poll_until(some_counted, timeout_s=60, what="a fifth of the stream counted")
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
        at_kill = await db.fetchval(COUNTED)
        assert at_kill < stream.total, "the planner finished before it was killed: the test proved nothing"

        second = start_planner_process(settings, tmp_path / "planner-2.log")
        try:
            await poll_until(
                lambda: drained(db, settings, stream),
                timeout_s=120,
                what="the restarted planner to drain the stream",
            )
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0, (tmp_path / "planner-2.log").read_text()[-3000:]
        await assert_counted_once(db, stream)
    finally:
        await db.close()
