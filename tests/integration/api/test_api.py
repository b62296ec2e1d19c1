"""The query API on the real Postgres and broker, fed by a real planner: every endpoint, the token
scopes, the cross-tenant refusals, and admin actions that the planner acts on."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
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
from tests.integration.chromium import SCREENSHOTS, chromium
from tests.integration.planner_harness import (
    MODEL,
    poll_until,
    produce,
    read_topic,
    request,
    run_warmplane,
)
from tests.real_parts import fresh_database, planner_settings_for
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.pg_retention import sweep_statistics
from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.codec import EventCodec
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    DeployStarted,
    Event,
    FleetScaled,
    ModelRef,
    PrefixMissed,
    PrefixPayload,
    ReplicaBecameReady,
    ReplicaStarted,
    ReplicaWarmingStarted,
    WarmPlanIssued,
)
from warmplane.shared.topics import Topics

_TIMEOUT_S = 30.0
OLD_AGE = timedelta(hours=3)
OLD_WINDOW_S = 4 * 3600
GLOBEX_SECRET = "globex confidential system prompt"


@dataclass
class World:
    api: RunningApi
    planner: PlannerSettings
    dsn: str
    plan_id: uuid.UUID


def _payload(prefix_id: int, text: str) -> PrefixPayload:
    return PrefixPayload(prefix_id=prefix_id, messages=[{"role": "system", "content": text}])


def _missed(chain: list[int], tenant: str) -> PrefixMissed:
    return PrefixMissed(
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="test",
        tenant=tenant,
        model=MODEL,
        replica="replica-0",
        chain=chain,
        chain_tokens=[100 * (i + 1) for i in range(len(chain))],
    )


def _traffic() -> list[Event]:
    """acme: 4 cold requests on [11, 12] and 6 with 100 cached tokens on [11, 13], 201 prompt tokens
    each, and 4 misses at 11; globex: 5 cold requests on [21], 101 prompt tokens each (its payload is
    its secret) and 5 misses. r-1 served acme's 6 cached requests and 3 of globex's, replica-0 (which
    no lifecycle event names) the rest; and 3 hours ago, r-1 served one more cached acme request,
    outside every window but `OLD_WINDOW_S`."""
    events: list[Event] = []
    events += [
        request([11, 12], payload=_payload(11, "acme shared prompt") if i == 0 else None) for i in range(4)
    ]
    events += [request([11, 13], cached_tokens=100, replica="r-1") for _ in range(6)]
    events += [
        request(
            [21],
            tenant="globex",
            payload=_payload(21, GLOBEX_SECRET) if i == 0 else None,
            replica="r-1" if i < 3 else "replica-0",
        )
        for i in range(5)
    ]
    events += [_missed([11, 12], "acme") for _ in range(4)]
    events += [_missed([21], "globex") for _ in range(5)]
    events.append(request([11, 13], cached_tokens=100, replica="r-1", at=datetime.now(UTC) - OLD_AGE))
    return events


@pytest.fixture(scope="module")
async def world(embedded_kafka: EmbeddedKafka, embedded_postgres: EmbeddedPostgres) -> AsyncIterator[World]:
    """A planner that ingested `_traffic()` and planned replica r-1 (still running), and the API over it."""
    async with fresh_database(embedded_postgres) as dsn:
        settings = planner_settings_for(embedded_kafka.bootstrap_servers, dsn)
        events = _traffic()
        db = await asyncpg.connect(dsn)
        try:
            async with running_planner(settings), running_api(api_settings(settings)) as api:
                await produce(settings.kafka, events)

                async def ingested() -> bool:
                    requests = await db.fetchval("SELECT coalesce(sum(requests), 0) FROM prefix_requests")
                    misses = await db.fetchval("SELECT coalesce(sum(misses), 0) FROM miss_stats")
                    return bool(requests == 16 and misses == 9)

                await poll_until(ingested, timeout_s=_TIMEOUT_S, what="the traffic ingested")
                start = ReplicaStarted(
                    event_id=new_event_id(),
                    occurred_at=datetime.now(UTC),
                    producer="warmer",
                    model=MODEL,
                    replica="r-1",
                    node="node-1",
                    endpoint="http://10.0.0.1:8000",
                )
                await produce(settings.kafka, [start])

                async def planned() -> bool:
                    return bool(await db.fetchval("SELECT count(*) FROM warm_plans") == 1)

                await poll_until(planned, timeout_s=_TIMEOUT_S, what="r-1's plan")
                plan_id = await db.fetchval("SELECT plan_id FROM warm_plans")
                yield World(api, settings, dsn, plan_id)
        finally:
            await db.close()


async def _get(
    world: World, path: str, token: str | None = ADMIN, **params: str | int | None
) -> httpx.Response:
    headers = bearer(token) if token else {}
    async with httpx.AsyncClient(base_url=world.api.url, timeout=10) as client:
        return await client.get(
            path, headers=headers, params={k: v for k, v in params.items() if v is not None}
        )


async def _post(world: World, path: str, body: object, token: str = ADMIN, **params: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=world.api.url, timeout=10) as client:
        return await client.post(path, headers=bearer(token), json=body, params=params)


async def test_replicas_show_state_and_latest_plan_and_unknown_ids_are_404(world: World) -> None:
    response = await _get(world, "/v1/replicas", READER, model=MODEL.name)
    assert response.status_code == 200
    [replica] = response.json()
    assert (replica["replica"], replica["node"], replica["model"], replica["state"]) == (
        "r-1",
        "node-1",
        MODEL.name,
        "starting",
    )
    assert replica["latest_plan"]["plan_id"] == str(world.plan_id)
    assert replica["latest_plan"]["state"] == "issued" and replica["latest_plan"]["items"] >= 1

    detail = (await _get(world, "/v1/replicas/r-1")).json()
    assert [t["state"] for t in detail["transitions"]] == ["starting"]
    assert (await _get(world, "/v1/replicas", state="ready")).json() == []

    missing = await _get(world, "/v1/replicas/r-404")
    assert missing.status_code == 404 and missing.json() == {"error": "no replica 'r-404'"}
    assert (await _get(world, f"/v1/plans/{uuid.uuid4()}")).status_code == 404


def _hit_figures(replica: dict[str, Any]) -> tuple[object, ...]:
    hits = replica["hits"]
    return tuple(
        hits[k]
        for k in (
            "requests",
            "cold_requests",
            "prompt_tokens",
            "cached_tokens",
            "prefix_hit_ratio",
            "cold_start_ratio",
        )
    )


async def test_a_replica_shows_the_hit_rate_of_the_requests_it_served_in_the_window(world: World) -> None:
    """r-1 served 6 of acme's requests (201 prompt tokens, 100 cached) and 3 of globex's (101, none
    cached) in the last hour; replica-0's requests are not r-1's, the 3-hour-old one is outside."""
    [replica] = (await _get(world, "/v1/replicas", READER, model=MODEL.name)).json()
    assert _hit_figures(replica) == (9, 3, 6 * 201 + 3 * 101, 600, 600 / 1509, 3 / 9)
    assert replica["hits"]["mean_ttft_ms"] is None  # no request reported one
    since = datetime.fromisoformat(replica["hits"]["since"])
    assert timedelta(hours=1) <= datetime.now(UTC) - since < timedelta(hours=1, minutes=2)

    older = (await _get(world, "/v1/replicas/r-1", ADMIN, window_s=OLD_WINDOW_S)).json()
    assert _hit_figures(older) == (10, 3, 7 * 201 + 3 * 101, 700, 700 / 1710, 3 / 10)
    assert [t["state"] for t in older["transitions"]] == ["starting"]


async def test_a_tenant_sees_only_its_own_share_of_a_replicas_hit_rate(world: World) -> None:
    [as_acme] = (await _get(world, "/v1/replicas", ACME, model=MODEL.name)).json()
    assert _hit_figures(as_acme) == (6, 0, 6 * 201, 600, 600 / 1206, 0.0)
    as_globex = (await _get(world, "/v1/replicas/r-1", GLOBEX)).json()
    # Traffic that found nothing cached is a 0% hit rate, not a missing one.
    assert _hit_figures(as_globex) == (3, 3, 303, 0, 0.0, 1.0)
    asked = (await _get(world, "/v1/replicas/r-1", READER, tenant="globex")).json()
    assert asked["hits"] == as_globex["hits"]
    acme_older = (await _get(world, "/v1/replicas/r-1", ACME, window_s=OLD_WINDOW_S)).json()
    assert _hit_figures(acme_older) == (7, 0, 7 * 201, 700, 700 / 1407, 0.0)
    # No traffic: counts are 0 and ratios null (no traffic is not a 0% hit rate).
    nobody = (await _get(world, "/v1/replicas/r-1", READER, tenant="nobody")).json()
    assert _hit_figures(nobody) == (0, 0, 0, 0, None, None)
    # Another tenant's share is refused like every other tenant-scoped figure.
    for path in ("/v1/replicas", "/v1/replicas/r-1"):
        refused = await _get(world, path, ACME, tenant="globex")
        assert refused.status_code == 403 and "globex" not in refused.text, path


async def test_a_tenant_token_sees_no_plan_of_a_replica_it_shares_with_other_tenants(world: World) -> None:
    """r-1's plan holds acme's and globex's items: its epoch, item count, tokens, hits and issue time
    (a re-plan follows any tenant's epoch bump) are the fleet's, not a tenant's."""
    for token in (ACME, GLOBEX):
        [listed] = (await _get(world, "/v1/replicas", token, model=MODEL.name)).json()
        detail = (await _get(world, "/v1/replicas/r-1", token)).json()
        assert listed["latest_plan"] is None and detail["latest_plan"] is None
        assert str(world.plan_id) not in str(listed) + str(detail)
    for token in (READER, ADMIN):
        detail = (await _get(world, "/v1/replicas/r-1", token, tenant="acme")).json()
        assert detail["latest_plan"]["plan_id"] == str(world.plan_id)


async def test_a_tenant_token_lists_the_fleets_models_and_its_own_not_another_tenants(world: World) -> None:
    db = await asyncpg.connect(world.dsn)
    try:
        await db.execute(
            "INSERT INTO scopes (tenant, model, prompt_rev) VALUES ('globex', 'globex-private-model', '')"
        )
        assert "globex-private-model" in (await _get(world, "/v1/models", READER)).json()
        assert "globex-private-model" in (await _get(world, "/v1/models", GLOBEX)).json()
        as_acme = await _get(world, "/v1/models", ACME)
        assert as_acme.json() == [MODEL.name] and "globex" not in as_acme.text
    finally:
        await db.execute("DELETE FROM scopes WHERE model = 'globex-private-model'")
        await db.close()


async def test_plans_list_outcomes_and_items_show_previews_to_admins_only(world: World) -> None:
    [plan] = (await _get(world, "/v1/plans", READER, replica="r-1")).json()
    assert plan["plan_id"] == str(world.plan_id) and plan["state"] == "issued"
    as_reader = (await _get(world, f"/v1/plans/{world.plan_id}", READER)).json()
    as_admin = (await _get(world, f"/v1/plans/{world.plan_id}", ADMIN)).json()
    assert {i["prefix_id"] for i in as_admin["item_list"]} == {11, 21}
    assert all(item["preview"] is None for item in as_reader["item_list"])
    previews = {i["prefix_id"]: i["preview"] for i in as_admin["item_list"]}
    assert previews[21] == f"system: {GLOBEX_SECRET}"
    assert GLOBEX_SECRET not in (await _get(world, f"/v1/plans/{world.plan_id}", READER)).text


async def test_tokens_are_required_and_a_tenant_token_reads_only_its_tenant(world: World) -> None:
    anonymous = await _get(world, "/v1/replicas", None)
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
    assert (await _get(world, "/v1/replicas", "not-a-token-of-ours")).status_code == 401

    # Another tenant's figures: refused with a message naming only the caller's own tenant.
    for path in ("/v1/traffic", "/v1/misses/top", "/v1/epochs"):
        refused = await _get(world, path, ACME, tenant="globex")
        assert refused.status_code == 403, path
        assert "globex" not in refused.text and "acme" in refused.text
        # A tenant that does not exist is refused the same way: existence leaks nothing.
        assert (await _get(world, path, ACME, tenant="nobody")).json() == refused.json()
    # Fleet-wide views mix tenants: not for tenant tokens.
    assert (await _get(world, "/v1/plans", ACME)).status_code == 403
    assert (await _get(world, f"/v1/plans/{world.plan_id}", ACME)).status_code == 403
    # Actions need an admin token.
    for token in (READER, ACME):
        forbidden = await _post(world, "/v1/epochs/bump", {}, token, tenant="acme", model=MODEL.name)
        assert forbidden.status_code == 403


async def test_top_misses_show_payload_previews_only_to_callers_allowed_that_tenant(world: World) -> None:
    as_admin = (await _get(world, "/v1/misses/top", ADMIN, model=MODEL.name)).json()
    assert [(m["tenant"], m["prefix_id"], m["misses"]) for m in as_admin] == [
        ("globex", 21, 5),
        ("acme", 11, 4),
    ]
    assert as_admin[0]["preview"] == f"system: {GLOBEX_SECRET}" and as_admin[0]["tokens"] == 100
    assert as_admin[1]["missed_tokens"] == 4 * 200

    as_reader = (await _get(world, "/v1/misses/top", READER)).json()
    assert [m["prefix_id"] for m in as_reader] == [21, 11]
    assert all(m["preview"] is None for m in as_reader)

    as_acme = await _get(world, "/v1/misses/top", ACME)
    assert [(m["tenant"], m["prefix_id"], m["preview"]) for m in as_acme.json()] == [
        ("acme", 11, "system: acme shared prompt")
    ]
    assert GLOBEX_SECRET not in as_acme.text and "globex" not in as_acme.text
    as_globex = (await _get(world, "/v1/misses/top", GLOBEX, limit=1)).json()
    assert [(m["tenant"], m["preview"]) for m in as_globex] == [("globex", f"system: {GLOBEX_SECRET}")]


async def test_traffic_gives_hit_and_cold_start_ratios_per_tenant_and_model(world: World) -> None:
    points = (await _get(world, "/v1/traffic", READER, window_s=3600)).json()
    totals: dict[str, list[int]] = {}
    for point in points:
        total = totals.setdefault(point["tenant"], [0, 0, 0, 0])
        for i, key in enumerate(("requests", "cold_requests", "prompt_tokens", "cached_tokens")):
            total[i] += point[key]
    assert totals == {"acme": [10, 4, 10 * 201, 600], "globex": [5, 5, 5 * 101, 0]}
    whole = (await _get(world, "/v1/traffic", ACME, step_s=3600)).json()
    assert {p["tenant"] for p in whole} == {"acme"}
    if len(whole) == 1:  # the hour did not straddle a step boundary
        assert whole[0]["cold_start_ratio"] == pytest.approx(0.4)
        assert whole[0]["prefix_hit_ratio"] == pytest.approx(600 / 2010)


async def test_traffic_counts_a_request_once_before_and_after_its_detail_is_summed(world: World) -> None:
    def totals(points: list[dict[str, object]]) -> dict[tuple[object, object], object]:
        return {(p["tenant"], p["start"]): (p["requests"], p["cached_tokens"]) for p in points}

    before = (await _get(world, "/v1/traffic", ADMIN, window_s=OLD_WINDOW_S, step_s=3600)).json()
    bucket_s = world.planner.statistics.bucket_seconds
    cut = int((datetime.now(UTC) - OLD_AGE / 2).timestamp()) // bucket_s
    pool = await asyncpg.create_pool(world.dsn, min_size=1, max_size=1)
    try:  # the planner's sweep, with a detail cut between the request of 3 hours ago and the others
        # That request's leaf was new to its batch: its sums went straight to scope_traffic (migration
        # 0017). Whatever prefix_stats holds before the cut moves there too, and nothing is counted twice.
        detail = "SELECT count(*) FROM prefix_stats WHERE bucket < $1"
        older = await pool.fetchval(detail, cut)
        moved, _ = await sweep_statistics(pool, detail_before_bucket=cut, before_bucket=0)
        assert moved == older
        assert await pool.fetchval(detail, cut) == 0
    finally:
        await pool.close()
    after = (await _get(world, "/v1/traffic", ADMIN, window_s=OLD_WINDOW_S, step_s=3600)).json()
    assert totals(after) == totals(before)
    assert sum(p["requests"] for p in after if p["tenant"] == "acme") == 11


async def test_warm_sets_show_what_live_replicas_were_planned_and_the_traffic_it_covers(world: World) -> None:
    sets = (await _get(world, "/v1/warm-sets", READER, model=MODEL.name)).json()
    by_tenant = {s["tenant"]: s for s in sets}
    assert set(by_tenant) == {"acme", "globex"}
    acme = by_tenant["acme"]
    assert (acme["epoch"], acme["prefixes"], acme["tokens"], acme["replicas"]) == (0, 1, 100, ["r-1"])
    # Every acme request's chain starts at 11, the warm prefix.
    assert (acme["requests_covered"], acme["requests"], acme["coverage"]) == (10, 10, 1.0)
    assert acme["verified_replicas"] == []
    only_acme = (await _get(world, "/v1/warm-sets", ACME, model=MODEL.name)).json()
    assert [s["tenant"] for s in only_acme] == ["acme"]


async def test_warm_sets_are_computed_once_per_model_scope_and_window_while_fresh(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each answer reads every chain node of each warm scope: callers asking alike (the status page asks
    for every model every 5 s) within `warm_sets_cache_s` share one reading."""
    read = world.api.deps.read
    scopes_read: list[str] = []
    chain_parents = read.chain_parents

    async def counted(model: str, tenant: str, prompt_rev: str) -> dict[int, int | None]:
        scopes_read.append(tenant)
        return await chain_parents(model, tenant, prompt_rev)

    monkeypatch.setattr(read, "chain_parents", counted)
    window = 7_201  # asked by no other test: nothing kept yet
    answers = await asyncio.gather(
        *(_get(world, "/v1/warm-sets", READER, model=MODEL.name, window_s=window) for _ in range(5))
    )
    assert len({a.text for a in answers}) == 1 and {s["tenant"] for s in answers[0].json()} == {
        "acme",
        "globex",
    }
    assert sorted(scopes_read) == ["acme", "globex"]
    again = await _get(world, "/v1/warm-sets", ADMIN, model=MODEL.name, window_s=window)
    assert again.text == answers[0].text and len(scopes_read) == 2
    # Another tenant scope is another answer: acme's is computed from acme's scope only.
    only_acme = await _get(world, "/v1/warm-sets", ACME, model=MODEL.name, window_s=window)
    assert [s["tenant"] for s in only_acme.json()] == ["acme"] and scopes_read[2:] == ["acme"]


async def test_bad_requests_get_a_4xx_that_says_what_is_wrong(world: World) -> None:
    bad_window = await _get(world, "/v1/traffic", ADMIN, window_s=5)
    assert bad_window.status_code == 422 and "window_s" in bad_window.json()["error"]
    bad_uuid = await _get(world, "/v1/plans/not-a-uuid")
    assert bad_uuid.status_code == 422 and "plan_id" in bad_uuid.json()["error"]
    bad_state = await _get(world, "/v1/replicas", ADMIN, state="sleeping")
    assert bad_state.status_code == 422 and "state" in bad_state.json()["error"]
    bad_scale = await _post(
        world, "/v1/fleet/scale", {"model": MODEL.name, "from_replicas": -1, "to_replicas": 2}
    )
    assert bad_scale.status_code == 422 and "from_replicas" in bad_scale.json()["error"]
    async with httpx.AsyncClient(base_url=world.api.url) as client:
        headers = {**bearer(ADMIN), "Content-Type": "application/json"}
        not_json = await client.post("/v1/deploys", headers=headers, content=b"{oops")
    assert not_json.status_code == 422 and "JSON" in not_json.json()["error"]


async def test_an_epoch_bump_through_the_api_is_recorded_and_replans_the_live_replicas(world: World) -> None:
    before = (await _get(world, "/v1/epochs/history", ACME, tenant="acme", model=MODEL.name)).json()
    bumped = await _post(
        world, "/v1/epochs/bump", {"reason": "new system prompt"}, tenant="acme", model=MODEL.name
    )
    assert bumped.status_code == 202
    accepted = bumped.json()
    assert accepted["type"] == "epoch.bumped" and accepted["epoch"] == before["epoch"] + 1

    async def recorded() -> bool:
        epochs = (await _get(world, "/v1/epochs", ACME)).json()
        return bool(epochs and epochs[0]["epoch"] == accepted["epoch"])

    await poll_until(recorded, timeout_s=_TIMEOUT_S, what="the bump recorded by the planner")
    history = (await _get(world, "/v1/epochs/history", ACME, tenant="acme", model=MODEL.name)).json()
    assert history["reason"] == "new system prompt"
    assert history["history"][0]["event_id"] == accepted["event_id"]
    assert history["history"][0]["epoch"] == accepted["epoch"]

    async def replanned() -> bool:
        plans = (await _get(world, "/v1/plans", READER, replica="r-1")).json()
        return any(p["epoch"] == accepted["epoch"] for p in plans)

    await poll_until(replanned, timeout_s=_TIMEOUT_S, what="r-1 planned at the new epoch")
    plans = await read_topic(world.planner.kafka, Topics(world.planner.kafka.topic_prefix).plans)
    codec = EventCodec(world.planner.kafka.max_event_bytes)
    bump_plans = [p for p in map(codec.decode, (r.value for r in plans)) if isinstance(p, WarmPlanIssued)]
    assert any(p.epoch == accepted["epoch"] and p.tenant == "acme" for p in bump_plans)


async def test_deploy_and_scale_announcements_reach_the_lifecycle_topic_with_who_sent_them(
    world: World,
) -> None:
    deploy = await _post(
        world,
        "/v1/deploys",
        {"phase": "started", "model": MODEL.name, "revision": "rev-2", "prompt_revs": ["p7"]},
    )
    scale = await _post(world, "/v1/fleet/scale", {"model": MODEL.name, "from_replicas": 1, "to_replicas": 3})
    assert (deploy.status_code, scale.status_code) == (202, 202)
    kafka = world.planner.kafka
    records = await read_topic(kafka, Topics(kafka.topic_prefix).lifecycle)
    codec = EventCodec(kafka.max_event_bytes)
    events = {
        str(e.event_id): e for e in map(codec.decode, (r.value for r in records)) if isinstance(e, Event)
    }
    started = events[deploy.json()["event_id"]]
    assert isinstance(started, DeployStarted)
    assert (started.model.revision, started.prompt_revs, started.producer) == ("rev-2", ["p7"], "api:ci")
    scaled = events[scale.json()["event_id"]]
    assert isinstance(scaled, FleetScaled) and (scaled.from_replicas, scaled.to_replicas) == (1, 3)

    db = await asyncpg.connect(world.dsn)
    try:

        async def recorded() -> bool:
            count = await db.fetchval(
                "SELECT count(*) FROM fleet_changes WHERE event_id = ANY($1::uuid[])",
                [started.event_id, scaled.event_id],
            )
            return bool(count == 2)

        await poll_until(recorded, timeout_s=_TIMEOUT_S, what="the planner to record both")
    finally:
        await db.close()


async def test_operational_endpoints_answer_without_a_token(world: World) -> None:
    assert (await _get(world, "/healthz", None)).text == "ok"
    assert (await _get(world, "/readyz", None)).status_code == 200
    page = await _get(world, "/status", None)
    assert page.status_code == 200 and "<title>Warmplane status</title>" in page.text
    # Per-tenant health figures are on the metrics port (kept in the cluster), not the API's.
    await _get(world, "/v1/replicas", READER)
    for token in (None, ACME, ADMIN):
        public = await _get(world, "/metrics", token)
        assert public.status_code == 404 and "prefix_hit_ratio" not in public.text
    async with httpx.AsyncClient(timeout=10) as client:
        metrics = (await client.get(f"{world.api.metrics_url}/metrics")).text
    assert 'warmplane_api_requests_total{route="/v1/replicas",status="200"}' in metrics
    spec = (await _get(world, "/openapi.json", None)).json()
    assert {"/v1/replicas", "/v1/warm-sets", "/v1/epochs/bump", "/v1/deploys"} <= set(spec["paths"])


async def test_no_input_from_the_openapi_document_gets_a_server_error(world: World, tmp_path: Path) -> None:
    """schemathesis generates requests for every operation from the published document (admin token,
    so every route is reached past authentication) and checks every answer: no 5xx, status codes and
    bodies as documented."""
    run = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        f"{world.api.url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        "25",
        "--seed",
        "7",
        "--header",
        f"Authorization: Bearer {ADMIN}",
        "--request-timeout",
        "10",
        "--workers",
        "1",
        "--report-dir",
        str(tmp_path),
        cwd=tmp_path,  # its cache of findings too
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(run.communicate(), 300)
    assert run.returncode == 0, output.decode(errors="replace")[-6000:]


async def test_the_status_page_shows_replicas_warm_sets_and_health_in_headlesschromium(world: World) -> None:
    """The page loads its figures with the token from its fragment (never sent to the server) and
    renders them; the screenshot stays in .warmplane/screenshots/ for people to look at."""
    url = f"{world.api.url}/status#token={READER}"
    dom = (await chromium("--dump-dom", url)).decode()
    assert 'data-loaded="true"' in dom, dom[-3000:]
    assert '<span class="state starting">starting</span>' in dom
    replica_row = dom[dom.index("<td>r-1</td>") :].split("</tr>", 1)[0]
    assert f"<td>{MODEL.name}</td><td>node-1</td>" in replica_row
    # r-1's requests in the last 15 minutes and their hit ratio: 600 of 1,509 prompt tokens cached.
    assert replica_row.endswith('<td class="num">9</td><td class="num">39.8%</td>'), replica_row
    assert "<td>acme</td><td>10</td>" in dom.replace(' class="num"', "")
    assert "<td>globex</td><td>5</td>" in dom.replace(' class="num"', "")
    # globex's requests were all cold: its cold-start ratio is flagged against the 30% alarm.
    assert '<td class="num alarm">100.0%</td>' in dom
    assert 'id="error"></span>' in dom

    shot = SCREENSHOTS / "status-page.png"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot.unlink(missing_ok=True)
    await chromium(f"--screenshot={shot}", url)
    image = shot.read_bytes()
    assert image[:8] == b"\x89PNG\r\n\x1a\n" and len(image) > 10_000


async def _cli(world: World, token: str, *args: str) -> tuple[int, str]:
    """Run `warmplane ARGS` as a process against the API, the token in its environment."""
    return await run_warmplane({"WARMPLANE_API_URL": world.api.url, "WARMPLANE_CLI_TOKEN": token}, *args)


async def test_the_cli_prints_tables_and_json_acts_and_refuses_with_the_apis_reason(world: World) -> None:
    code, table = await _cli(world, READER, "misses", "--model", MODEL.name)
    lines = table.splitlines()
    assert code == 0 and lines[0].split() == [
        "TENANT",
        "MODEL",
        "PREFIX_ID",
        "MISSES",
        "MISSED_TOKENS",
        "TOKENS",
        "PREVIEW",
    ]
    assert lines[1].split()[:4] == ["globex", MODEL.name, "21", "5"] and GLOBEX_SECRET not in table

    code, as_json = await _cli(world, ACME, "misses", "--json")
    assert code == 0
    assert [(m["tenant"], m["preview"]) for m in json.loads(as_json)] == [
        ("acme", "system: acme shared prompt")
    ]

    code, replicas = await _cli(world, ACME, "replicas", "--model", MODEL.name)
    header, row = replicas.splitlines()
    assert code == 0 and header.split()[-3:] == ["REQUESTS", "HIT_RATE", "REASON"]
    assert row.split()[0] == "r-1" and row.split()[-2:] == ["6", f"{600 / 1206:.3f}"]
    code, older = await _cli(world, READER, "replica", "r-1", "--tenant", "acme", "--window-s", "14400")
    assert code == 0 and older.splitlines()[1].split()[-2:] == ["7", f"{700 / 1407:.3f}"]

    code, refused = await _cli(world, READER, "scale", "--model", MODEL.name, "--from", "1", "--to", "2")
    assert code == 1 and "403 this action needs an admin token" in refused
    code, unauthenticated = await _cli(world, "", "replicas")
    assert code == 1 and "401" in unauthenticated and "WARMPLANE_CLI_TOKEN" in unauthenticated


async def test_wait_ready_follows_a_replica_until_it_turns_ready(world: World) -> None:
    """Another model's replica, so the other tests' figures stay as they are."""
    other = ModelRef("cli-model", "rev-1")

    def lifecycle(kind: type[ReplicaStarted | ReplicaWarmingStarted | ReplicaBecameReady]) -> Event:
        return kind(
            event_id=new_event_id(),
            occurred_at=datetime.now(UTC),
            producer="warmer",
            model=other,
            replica="r-cli",
            node="node-9",
        )

    await produce(world.planner.kafka, [lifecycle(ReplicaStarted)])
    await poll_until(
        lambda: _status_is(world, "r-cli", "starting"), timeout_s=_TIMEOUT_S, what="r-cli recorded"
    )
    waiting = asyncio.create_task(
        _cli(world, READER, "wait-ready", "r-cli", "--poll-s", "0.2", "--timeout-s", "60")
    )
    await produce(world.planner.kafka, [lifecycle(ReplicaWarmingStarted), lifecycle(ReplicaBecameReady)])
    code, output = await waiting
    assert code == 0 and output.strip().endswith("r-cli is ready (plan issued)")

    code, timed_out = await _cli(world, READER, "wait-ready", "r-1", "--poll-s", "0.2", "--timeout-s", "0.5")
    assert code == 2 and "r-1 is still starting after" in timed_out


async def _status_is(world: World, replica: str, state: str) -> bool:
    response = await _get(world, f"/v1/replicas/{replica}", READER)
    return response.status_code == 200 and response.json()["state"] == state


async def test_a_rewarm_through_the_api_plans_the_replica_in_full_for_its_warmer(world: World) -> None:
    unknown = await _post(world, "/v1/rewarms", {"replica": "r-404"})
    assert unknown.status_code == 404 and unknown.json() == {"error": "no replica 'r-404'"}
    code, output = await _cli(world, ADMIN, "rewarm", "r-1", "--reason", "engine restarted by hand")
    assert code == 0 and output.startswith("re-warm of r-1 requested (event ")
    event_id = output.rsplit("(event ", 1)[1].rstrip(")\n")
    kafka = world.planner.kafka
    codec = EventCodec(kafka.max_event_bytes)

    async def planned() -> bool:
        records = await read_topic(kafka, Topics(kafka.topic_prefix).plans)
        return any(
            isinstance(plan, WarmPlanIssued) and plan.rewarm and plan.replica == "r-1"
            for plan in map(codec.decode, (r.value for r in records))
        )

    await poll_until(planned, timeout_s=_TIMEOUT_S, what="r-1's re-warm plan")
    history = (await _get(world, "/v1/epochs/history", ADMIN, tenant="acme", model=MODEL.name)).json()
    assert event_id not in {change["event_id"] for change in history["history"]}  # not an epoch change
