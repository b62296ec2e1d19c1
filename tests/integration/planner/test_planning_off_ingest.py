"""Planning runs off the ingest path, on the real broker and Postgres: while a replica's plan is being chosen
(the chooser held on purpose), ingestion goes on committing batches; the plan follows once it is let go."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from tests.integration.planner_harness import poll_until, produce, replica_started, request
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.plan_choice import Choice, WarmSetChooser
from warmplane.services.planner.settings import PlannerSettings

_TIMEOUT_S = 30.0


async def test_ingestion_commits_batches_while_a_plan_is_being_chosen(
    planner_settings: PlannerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    choosing, release = asyncio.Event(), asyncio.Event()
    choose = WarmSetChooser.choose

    async def held(self: WarmSetChooser, *args: Any, **kwargs: Any) -> dict[str, Choice]:
        choosing.set()
        await release.wait()
        return await choose(self, *args, **kwargs)

    monkeypatch.setattr(WarmSetChooser, "choose", held)
    kafka = planner_settings.kafka
    db = await asyncpg.connect(planner_settings.postgres.asyncpg_dsn())

    async def counted(requests: int) -> bool:
        return bool(await db.fetchval("SELECT coalesce(sum(requests), 0) FROM prefix_requests") == requests)

    try:
        async with running_planner(planner_settings) as planner:
            await produce(kafka, [request([1, 2]) for _ in range(5)])
            await poll_until(lambda: counted(5), timeout_s=_TIMEOUT_S, what="the first requests")
            await produce(kafka, [replica_started("r-1", datetime.now(UTC))])
            await asyncio.wait_for(choosing.wait(), _TIMEOUT_S)

            try:
                # The plan is being chosen. Ingestion commits batch after batch meanwhile.
                for round_ in range(1, 4):
                    await produce(kafka, [request([1, 2]) for _ in range(10)])
                    await poll_until(
                        lambda n=5 + 10 * round_: counted(n),  # type: ignore[misc]
                        timeout_s=15,
                        what=f"batch {round_} committed while a plan is being chosen",
                    )
                assert not planner.metrics.plans_issued._value.get()
            finally:
                release.set()

            async def issued() -> bool:
                return bool(planner.metrics.plans_issued._value.get() == 1)

            await poll_until(issued, timeout_s=_TIMEOUT_S, what="the plan, once chosen")
    finally:
        await db.close()
