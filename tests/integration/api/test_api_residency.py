"""A replica's residency in the API and the CLI, fed by a real planner on the real broker and Postgres:
shown only for the replica's current start, counts only, and a tenant sees its own namespaces alone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from tests.integration.api_harness import (
    ACME,
    ADMIN,
    GLOBEX,
    READER,
    RunningApi,
    api_settings,
    bearer,
    running_api,
)
from tests.integration.planner_harness import (
    poll_until,
    produce,
    replica_started,
    residency_report,
)
from warmplane.services.cli.main import main
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.events import HeldPrefixes

_TIMEOUT_S = 30.0


@pytest.fixture
async def api(planner_settings: PlannerSettings) -> AsyncIterator[tuple[RunningApi, PlannerSettings]]:
    async with running_planner(planner_settings), running_api(api_settings(planner_settings)) as running:
        yield running, planner_settings


async def _residency(api: RunningApi, token: str, **params: str) -> Any:
    async with httpx.AsyncClient(base_url=api.url, timeout=10) as client:
        response = await client.get("/v1/replicas/r-1", headers=bearer(token), params=params)
    assert response.status_code == 200, response.text
    return response.json()["residency"]


async def test_a_replicas_residency_is_its_report_on_its_current_start_in_the_callers_scope(
    api: tuple[RunningApi, PlannerSettings],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    running, settings = api
    now = datetime.now(UTC)
    start = replica_started("r-1", now)
    earlier_start = residency_report("r-1", uuid.uuid4(), now, [HeldPrefixes("acme", "", 0, [99])])
    await produce(settings.kafka, [start, earlier_start])
    db = await asyncpg.connect(settings.postgres.asyncpg_dsn())
    try:
        # Two topics, read independently: the report may be stored before the start or after it.
        both = "SELECT (SELECT count(*) FROM replica_residency) + (SELECT count(*) FROM replicas)"
        await poll_until(
            lambda: _equals(db, both, 2), timeout_s=_TIMEOUT_S, what="the start and report stored"
        )
    finally:
        await db.close()
    assert await _residency(running, ADMIN) is None  # a report on another start is not this one's

    current = residency_report(
        "r-1",
        start.event_id,
        now + timedelta(seconds=1),
        [
            HeldPrefixes("globex", "", 1, [5, 6]),
            HeldPrefixes("acme", "v1", 2, [1, 2, 3]),
            HeldPrefixes("acme", "", 0, [4]),
        ],
        lost=2,
        complete=False,
    )
    await produce(settings.kafka, [current])

    async def reported() -> bool:
        return await _residency(running, READER) is not None

    await poll_until(reported, timeout_s=_TIMEOUT_S, what="the current start's report shown")
    everyone = await _residency(running, ADMIN)
    assert datetime.fromisoformat(everyone.pop("reported_at")) == current.occurred_at
    assert everyone == {
        "held": 6,
        "lost": 2,
        "complete": False,
        "by_tenant": [
            {"tenant": "acme", "prompt_rev": "", "epoch": 0, "prefixes": 1},
            {"tenant": "acme", "prompt_rev": "v1", "epoch": 2, "prefixes": 3},
            {"tenant": "globex", "prompt_rev": "", "epoch": 1, "prefixes": 2},
        ],
    }
    # A tenant sees its own namespaces and counts, not another's name nor the replica-wide `lost`.
    as_acme = await _residency(running, ACME)
    assert (as_acme["held"], as_acme["lost"], as_acme["complete"]) == (4, None, False)
    assert as_acme["by_tenant"] == everyone["by_tenant"][:2]
    assert "globex" not in str(as_acme)
    assert await _residency(running, READER, tenant="acme") == as_acme
    as_globex = await _residency(running, GLOBEX)
    assert (as_globex["held"], as_globex["by_tenant"]) == (2, everyone["by_tenant"][2:])
    assert (await _residency(running, READER, tenant="initech"))["by_tenant"] == []
    async with httpx.AsyncClient(base_url=running.url, timeout=10) as client:
        refused = await client.get("/v1/replicas/r-1", headers=bearer(ACME), params={"tenant": "globex"})
    assert refused.status_code == 403 and "globex" not in refused.text

    # `warmplane replica r-1` (run in-process, an acme token in its environment) shows the line in scope.
    monkeypatch.setenv("WARMPLANE_API_URL", running.url)
    monkeypatch.setenv("WARMPLANE_CLI_TOKEN", ACME)
    assert await asyncio.to_thread(main, ["replica", "r-1"]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("residency")]
    assert line.endswith(": 4 held, incomplete: more may be held; acme@0: 1, acme/v1@2: 3"), line

    # It restarts: the report was on the start before, so nothing is shown until its warmer reports again.
    await produce(settings.kafka, [replica_started("r-1", now + timedelta(seconds=5))])

    async def restarted() -> bool:
        return await _residency(running, ADMIN) is None

    await poll_until(restarted, timeout_s=_TIMEOUT_S, what="the restart recorded")


async def _equals(db: asyncpg.Connection, query: str, value: object) -> bool:
    return bool(await db.fetchval(query) == value)
