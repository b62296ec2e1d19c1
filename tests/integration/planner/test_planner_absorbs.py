"""A planner counting alone plans a later start from its kept read brought up to date with the batches it
committed since (`core.absorbed_counts`), on the real broker and Postgres: no second read, and the plan is
the one a chooser reading the database at that moment makes (new chains and new payloads included)."""

from __future__ import annotations

import asyncpg
from prometheus_client import CollectorRegistry

from tests.integration.planner.test_planner_plans import payload, started, traffic
from tests.integration.planner_harness import MODEL, events_on, poll_until, produce, request
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.pg_plans import PgPlanStore
from warmplane.services.planner.plan_choice import WarmSetChooser
from warmplane.services.planner.settings import PlannerSettings, PlanSettings
from warmplane.shared.events import Event, WarmPlanIssued
from warmplane.shared.topics import Topics

_TIMEOUT_S = 30.0


def later_traffic() -> list[Event]:
    """After the first plan: a new chain below a known root turns hot (catalogued on its first request),
    a new root appears, and a known chain gets more."""
    events: list[Event] = []
    events += [request([9, 40, 41], payload=payload(41) if i == 0 else None) for i in range(40)]
    events += [request([50], payload=payload(50) if i == 0 else None) for i in range(25)]
    events += [request([1, 4]) for _ in range(6)]
    return events


def absorbing(planner_settings: PlannerSettings, *, live_s: float) -> PlannerSettings:
    """Plans of every root for each replica (a and b plan alike), no read shared (a plan without a read
    absorbed), kept reads living `live_s`."""
    return planner_settings.model_copy(
        update={
            "routing": planner_settings.routing.model_copy(update={"mode": "spread"}),
            "plans": PlanSettings(
                budget_tokens=800,
                max_items=20,
                min_expected_saved_tokens=0,
                statistics_max_age_s=0,
                statistics_live_s=live_s,
            ),
        }
    )


async def test_a_start_after_new_traffic_is_planned_from_the_kept_read_as_a_read_would_plan_it(
    planner_settings: PlannerSettings,
) -> None:
    settings = absorbing(planner_settings, live_s=60)
    kafka = settings.kafka
    first, later = traffic(), later_traffic()
    await produce(kafka, first)
    pool = await asyncpg.create_pool(settings.postgres.asyncpg_dsn(), min_size=1, max_size=2)
    total = "SELECT coalesce(sum(requests), 0) FROM prefix_requests"
    try:
        async with running_planner(settings) as planner:
            await poll_until(lambda: _equals(pool, total, len(first)), timeout_s=_TIMEOUT_S, what="traffic")
            plan_a = await _start(settings, "a")
            await produce(kafka, later)
            await poll_until(
                lambda: _equals(pool, total, len(first) + len(later)), timeout_s=_TIMEOUT_S, what="more"
            )
            plan_b = await _start(settings, "b")
            reads = {how: _reads(planner.metrics, how) for how in ("read", "shared", "absorbed")}
        assert reads == {"read": 1, "shared": 0, "absorbed": 1}
        assert 50 in {item.prefix_id for item in plan_b.items}  # a root counted after the read
        assert not {41, 50} & {item.prefix_id for item in plan_a.items}
        chooser = WarmSetChooser(
            PgPlanStore(pool),
            settings.plans,
            settings.routing,
            bucket_seconds=settings.statistics.bucket_seconds,
            max_plan_bytes=kafka.max_event_bytes,
            clock=lambda: plan_b.occurred_at,
        )
        [choice] = (await chooser.choose(MODEL.name, None, 0, ["b"])).values()
        assert [(i.tenant, i.prefix_id, i.tokens) for i in plan_b.items] == [
            (i.tenant, i.prefix_id, i.tokens) for i in choice.items
        ]
    finally:
        await pool.close()


async def test_a_kept_read_is_made_again_before_it_ages_and_the_next_start_takes_it_as_it_absorbs(
    planner_settings: PlannerSettings,
) -> None:
    """While requests keep coming, a kept read in the last quarter of its `statistics_live_s` is read again
    beside the planning task: a start after the first read's life is planned from the new read, brought
    up to date with what was counted after it, with no read of its own."""
    live_s = 12.0
    settings = absorbing(planner_settings, live_s=live_s)
    kafka = settings.kafka
    first = traffic()
    await produce(kafka, first)
    pool = await asyncpg.create_pool(settings.postgres.asyncpg_dsn(), min_size=1, max_size=2)
    total = "SELECT coalesce(sum(requests), 0) FROM prefix_requests"
    try:
        async with running_planner(settings) as planner:
            await poll_until(lambda: _equals(pool, total, len(first)), timeout_s=_TIMEOUT_S, what="traffic")
            await _start(settings, "a")

            async def refreshed() -> bool:
                await produce(kafka, [request([1, 4])])  # batches keep committing: each one can refresh
                return _reads(planner.metrics, "refreshed") >= 1

            await poll_until(refreshed, timeout_s=_TIMEOUT_S + live_s, what="a read made again")
            later = [request([60], payload=payload(60) if i == 0 else None) for i in range(30)]
            await produce(kafka, later)
            await poll_until(
                lambda: _equals(pool, "SELECT coalesce(sum(requests), 0) FROM prefix_requests"
                                " WHERE prefix_id = 60", 30),
                timeout_s=_TIMEOUT_S,
                what="the later root counted",
            )  # fmt: skip
            plan_b = await _start(settings, "b")
            reads = {how: _reads(planner.metrics, how) for how in ("read", "absorbed")}
        assert reads == {"read": 1, "absorbed": 1}, "b was planned from the read made again"
        assert 60 in {item.prefix_id for item in plan_b.items}, "which absorbed what was counted after it"
    finally:
        await pool.close()


async def _start(settings: PlannerSettings, replica: str) -> WarmPlanIssued:
    """Start `replica` and wait for its plan."""
    start = started(replica, f"node-{replica}")
    await produce(settings.kafka, [start])
    plans: list[WarmPlanIssued] = []

    async def planned() -> bool:
        topic = Topics(settings.kafka.topic_prefix).plans
        plans[:] = [
            plan
            for plan in await events_on(settings.kafka, topic, WarmPlanIssued)
            if plan.trigger_event_id == start.event_id
        ]
        return bool(plans)

    await poll_until(planned, timeout_s=_TIMEOUT_S, what=f"the plan of {replica}")
    return plans[0]


def _reads(metrics: PlannerMetrics, how: str) -> float:
    registry: CollectorRegistry = metrics.registry
    return registry.get_sample_value("warmplane_planner_statistics_reads_total", {"how": how}) or 0.0


async def _equals(pool: asyncpg.Pool, query: str, value: object) -> bool:
    return bool(await pool.fetchval(query) == value)
