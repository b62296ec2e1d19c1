"""Warm plans on the real broker and Postgres: a starting replica gets one plan chosen by the policy core
from the stored statistics, keyed by its node; a redelivered `replica.started` gets none; the store knows
what a replica holds since its latest start."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import msgspec
from aiokafka.partitioner import DefaultPartitioner
from prometheus_client import CollectorRegistry

from tests.integration.planner_harness import (
    MODEL,
    poll_until,
    produce,
    record_start,
    records_once,
    request,
)
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.pg_plans import PgPlanStore
from warmplane.services.planner.plan_choice import ModelStatistics
from warmplane.services.planner.plans import PlanIssuer
from warmplane.services.planner.settings import PlannerSettings, PlanSettings
from warmplane.shared.chain_nodes import pack_runs
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    Event,
    ModelRef,
    PrefixPayload,
    ReplicaStarted,
    ReplicaWeightsLoaded,
    WarmFinished,
    WarmItem,
    WarmPlanIssued,
)
from warmplane.shared.topics import Topics

_TIMEOUT_S = 30.0


def payload(prefix_id: int) -> PrefixPayload:
    return PrefixPayload(prefix_id=prefix_id, messages=[{"role": "system", "content": f"prefix {prefix_id}"}])


def traffic() -> list[Event]:
    """Requests of the planned model (two tenants) and of another model, with a few payloads.

    Through-counts (tokens): acme 1: 13 (100), 2: 5 (200), 3: 5 (300), 4: 8 (200), 9: 20 (100),
    10: 20 (200), 20..22: 30 (uncatalogued); globex 30: 3 (100). Catalogued: acme 1, 3, 4, 9; globex 30.
    """
    events: list[Event] = []
    events += [request([1, 2, 3], payload=payload(3) if i == 0 else None) for i in range(5)]
    events += [request([1, 4], payload={0: payload(4), 1: payload(1)}.get(i)) for i in range(8)]
    events += [request([9, 10], payload=payload(9) if i == 0 else None) for i in range(20)]
    events += [request([20, 21, 22]) for _ in range(30)]
    events += [request([30], tenant="globex", payload=payload(30) if i == 0 else None) for i in range(3)]
    other = ModelRef("other-model", "rev-1")
    events += [msgspec.structs.replace(request([9, 10], payload=payload(10)), model=other) for _ in range(50)]
    return events


def started(replica: str, node: str) -> ReplicaStarted:
    return ReplicaStarted(
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="warmer",
        model=MODEL,
        replica=replica,
        node=node,
        epoch=3,
    )


async def test_a_starting_replica_gets_one_plan_of_the_most_requested_prefixes(
    planner_settings: PlannerSettings,
) -> None:
    settings = planner_settings.model_copy(
        update={"plans": PlanSettings(budget_tokens=500, max_items=10, min_expected_saved_tokens=0)}
    )
    kafka = settings.kafka
    plans_topic = Topics(kafka.topic_prefix).plans
    events = traffic()
    await produce(kafka, events)
    db = await asyncpg.connect(settings.postgres.asyncpg_dsn())
    try:
        total = "SELECT coalesce(sum(requests), 0) FROM prefix_requests"
        async with running_planner(settings) as planner:
            # Popularity first: the lifecycle topic is read independently of the requests topic.
            await poll_until(lambda: _equals(db, total, len(events)), timeout_s=_TIMEOUT_S, what="traffic")
            trigger = started("r-new", "node-7")
            await produce(kafka, [trigger])
            await poll_until(lambda: _issued(planner.metrics, 1), timeout_s=_TIMEOUT_S, what="a plan")

            [(record, plan)] = await records_once(kafka, plans_topic)
            assert isinstance(plan, WarmPlanIssued)
            assert record.key == b"node-7"
            assert record.partition == DefaultPartitioner()(b"node-7", list(range(kafka.partitions)), [])
            assert (plan.replica, plan.node, plan.epoch, plan.budget_tokens) == ("r-new", "node-7", 3, 500)
            assert plan.event_id == plan.plan_id and plan.model == MODEL
            # The policy core: one replica, so its ring share is everything; no capacity reported yet, so
            # the settings' 500 tokens. By reuse probability in the ramp window (through-counts 20, 13, 8,
            # 5, 3): 9, 1, 4, then 3 with its uncatalogued parent 2 (200 tokens), and the budget is spent.
            # Each item is at its tenant's current epoch: no tenant was ever bumped, so 0.
            assert plan.items == [
                WarmItem(9, 100, payload(9), "acme", epoch=0),
                WarmItem(1, 100, payload(1), "acme", epoch=0),
                WarmItem(4, 200, payload(4), "acme", epoch=0),
                WarmItem(3, 300, payload(3), "acme", epoch=0),
            ]
            assert (plan.deadline - plan.occurred_at).total_seconds() == settings.plans.deadline_s

            row = await db.fetchrow("SELECT * FROM warm_plans")
            assert (row["plan_id"], row["replica_id"], row["node"], row["model"]) == (
                plan.plan_id,
                "r-new",
                "node-7",
                MODEL.name,
            )
            assert (row["state"], row["epoch"], row["trigger_event_id"]) == ("issued", 3, trigger.event_id)
            assert msgspec.json.decode(row["items"].encode(), type=list[WarmItem]) == plan.items

            # The same event again, then a later one on the replica's partition to know it was read.
            loaded = ReplicaWeightsLoaded(
                event_id=new_event_id(),
                occurred_at=datetime.now(UTC),
                producer="warmer",
                model=MODEL,
                replica="r-new",
                node="node-7",
            )
            await produce(kafka, [trigger, loaded])
            state = "SELECT state FROM replicas WHERE replica_id = 'r-new'"
            await poll_until(lambda: _equals(db, state, "loading"), timeout_s=_TIMEOUT_S, what="the marker")
        # Leaving the block drained the writer: whatever the copy could have triggered has happened.
        assert len(await records_once(kafka, plans_topic)) == 1
        assert await db.fetchval("SELECT count(*) FROM warm_plans") == 1
        assert planner.metrics.plans_issued._value.get() == 1
        assert planner.metrics.plan_failures._value.get() == 0
    finally:
        await db.close()


class _Published:
    def __init__(self, fail: bool = False) -> None:
        self.plans: list[WarmPlanIssued] = []
        self._fail = fail

    async def publish(self, plan: WarmPlanIssued) -> None:
        if self._fail:
            raise TimeoutError("the broker did not acknowledge")
        self.plans.append(plan)


async def test_issuing_is_idempotent_on_the_trigger_and_records_before_publishing(
    migrated_database: str,
) -> None:
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:
        store = PgPlanStore(pool)
        published, broken = _Published(), _Published(fail=True)
        metrics = PlannerMetrics(CollectorRegistry())

        def issuer(publisher: _Published) -> PlanIssuer:
            return PlanIssuer(
                store=store, publisher=publisher, settings=PlanSettings(), bucket_seconds=60, metrics=metrics
            )

        trigger = started("r-1", "node-1")
        plan = await issuer(published).issue(trigger)
        assert plan is not None and plan.items == []  # no traffic yet: an empty plan, still issued
        assert await issuer(published).issue(trigger) is None
        assert published.plans == [plan]
        # Two planners racing past the existence check: the unique trigger lets one row in.
        assert (
            await store.record([(msgspec.structs.replace(plan, plan_id=uuid.uuid4()), trigger.event_id)])
            == set()
        )

        unpublished = await issuer(broken).issue(started("r-2", "node-1"))
        assert unpublished is not None
        state = await pool.fetchval("SELECT state FROM warm_plans WHERE plan_id = $1", unpublished.plan_id)
        assert state == "issued"
        assert metrics.plan_failures._value.get() == 1
        assert await pool.fetchval("SELECT count(*) FROM warm_plans") == 2
    finally:
        await pool.close()


async def _issued(metrics: PlannerMetrics, count: int) -> bool:
    return bool(metrics.plans_issued._value.get() >= count)


async def _equals(db: asyncpg.Connection, query: str, value: object) -> bool:
    return bool(await db.fetchval(query) == value)


def one_item_plan(replica: str, node: str, now: datetime, trigger: uuid.UUID | None = None) -> WarmPlanIssued:
    """A plan of one catalogued prefix, issued at `now` with two minutes to run."""
    plan_id = new_event_id()
    return WarmPlanIssued(
        event_id=plan_id,
        occurred_at=now,
        producer="planner",
        model=MODEL,
        plan_id=plan_id,
        replica=replica,
        node=node,
        epoch=0,
        items=[WarmItem(1, 100, payload(1), "acme", epoch=0)],
        budget_tokens=100,
        deadline=now + timedelta(minutes=2),
        trigger_event_id=trigger,
    )


async def test_plans_recorded_together_are_one_statement_and_skip_those_their_trigger_has(
    migrated_database: str,
) -> None:
    """A scale-up of many replicas records and marks their plans in one statement each."""
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:
        store = PgPlanStore(pool)
        now = datetime.now(UTC)
        trigger = new_event_id()
        first = one_item_plan("r-0", "node-2", now, trigger=trigger)
        assert await store.record([(first, trigger)]) == {first.plan_id}
        batch = [one_item_plan(f"r-{i}", "node-2", now, trigger=trigger) for i in range(1, 4)]
        again = one_item_plan("r-0", "node-2", now, trigger=trigger)  # r-0 already has a plan for it
        assert await store.record([(plan, trigger) for plan in [*batch, again]]) == {p.plan_id for p in batch}
        assert await store.record([]) == set()
        await store.mark_published([plan.plan_id for plan in batch], now)
        later = now + timedelta(seconds=1)
        assert await store.unpublished(issued_before=later, alive_at=now) == [first]
    finally:
        await pool.close()


async def test_the_store_finds_unpublished_plans_and_unplanned_starts(migrated_database: str) -> None:
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:
        store = PgPlanStore(pool)
        now = datetime.now(UTC)
        start = started("r-late", "node-3")
        await pool.execute(
            "INSERT INTO replica_transitions (event_id, replica_id, state, occurred_at) "
            "VALUES ($1, $2, $3, $4)",
            start.event_id, "r-late", "starting", start.occurred_at,
        )  # fmt: skip
        await pool.execute(
            """INSERT INTO replicas (replica_id, node, model, model_revision, endpoint, state, state_since,
                                     last_event_id) VALUES ($1, $2, $3, $4, '', 'loading', $5, $6)""",
            "r-late", "node-3", MODEL.name, MODEL.revision, start.occurred_at, new_event_id(),
        )  # fmt: skip
        window = {"since": now - timedelta(minutes=5), "before": now + timedelta(seconds=1)}
        [unplanned] = await store.unplanned_starts(**window)
        assert (unplanned.replica, unplanned.node, unplanned.model, unplanned.trigger) == (
            "r-late",
            "node-3",
            MODEL,
            start.event_id,
        )
        assert await store.unplanned_starts(since=now - timedelta(minutes=5), before=start.occurred_at) == []

        plan = one_item_plan("r-late", "node-3", now, trigger=start.event_id)
        assert await store.record([(plan, start.event_id)]) == {plan.plan_id}
        assert await store.unplanned_starts(**window) == []  # planned now
        later = now + timedelta(seconds=1)
        assert await store.unpublished(issued_before=later, alive_at=now) == [plan]  # byte for byte
        assert await store.unpublished(issued_before=later, alive_at=plan.deadline) == []  # expired
        await store.mark_published([plan.plan_id], later)
        assert await store.unpublished(issued_before=later, alive_at=now) == []
    finally:
        await pool.close()


async def test_a_plans_first_outcome_stands(planner_settings: PlannerSettings) -> None:
    pool = await asyncpg.create_pool(planner_settings.postgres.asyncpg_dsn(), min_size=1, max_size=2)
    try:
        now = datetime.now(UTC)
        plan = one_item_plan("r-1", "node-1", now)
        plan_id = plan.plan_id
        assert await PgPlanStore(pool).record([(plan, new_event_id())]) == {plan_id}

        def finished(verified: int, failures: list[str]) -> WarmFinished:
            return WarmFinished(
                event_id=new_event_id(), occurred_at=datetime.now(UTC), producer="warmer/node-1", model=MODEL,
                plan_id=plan_id, replica="r-1", items_done=1, tokens_prefilled=100, verified_hits=verified,
                failures=failures, partial=bool(failures),
            )  # fmt: skip

        # The warm verified; later a warmer reading old plans again refuses it as expired.
        await produce(planner_settings.kafka, [finished(1, []), finished(0, ["refused: expired"])])
        async with running_planner(planner_settings) as planner:
            await poll_until(
                lambda: _counted(planner.metrics, "warm.finished", 2),
                timeout_s=_TIMEOUT_S,
                what="both results",
            )
        # Read once the planner has stopped (drained, so its after-commit work is done): the metric
        # agrees with the table, one plan and it verified.
        outcomes = {
            sample.labels["outcome"]: sample.value
            for metric in planner.metrics.plan_outcomes.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        }
        assert outcomes == {"verified": 1, "partial": 0, "failed": 0}
        row = await pool.fetchrow(
            "SELECT state, verified_hits, failures FROM warm_plans WHERE plan_id = $1", plan_id
        )
        assert (row["state"], row["verified_hits"], row["failures"]) == ("verified", 1, "[]")
    finally:
        await pool.close()


async def _counted(metrics: PlannerMetrics, event_type: str, count: int) -> bool:
    return metrics.events_ingested(event_type) >= count


async def test_the_store_knows_what_a_replica_holds_since_its_latest_start(migrated_database: str) -> None:
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:
        store = PgPlanStore(pool)
        now = datetime.now(UTC)

        async def start(at: datetime) -> uuid.UUID:
            return await record_start(pool, "r-h", at)

        async def verified(plan: WarmPlanIssued, trigger: uuid.UUID, state: str = "verified") -> None:
            assert await store.record([(plan, trigger)]) == {plan.plan_id}
            await pool.execute("UPDATE warm_plans SET state = $2 WHERE plan_id = $1", plan.plan_id, state)

        assert await store.held("r-h") == []  # never started
        first = await start(now)
        await verified(one_item_plan("r-h", "node-1", now, trigger=first), first)
        later = msgspec.structs.replace(one_item_plan("r-h", "node-1", now + timedelta(seconds=1)), epoch=4)
        items = [msgspec.structs.replace(later.items[0], prefix_id=2, epoch=None)]
        await verified(msgspec.structs.replace(later, items=items), new_event_id())  # a bump's plan
        partial = one_item_plan("r-h", "node-1", now + timedelta(seconds=2))
        await verified(msgspec.structs.replace(partial, items=[partial.items[0]]), new_event_id(), "partial")
        # The start's plan and the bump's (its item in the plan's epoch); a partial plan's items are unknown.
        assert sorted((h.prefix_id, h.tenant, h.epoch) for h in await store.held("r-h")) == [
            (1, "acme", 0),
            (2, "acme", 4),
        ]
        # It crashed and came back: nothing is held until the new start's plan verifies.
        second = await start(now + timedelta(seconds=5))
        assert await store.held("r-h") == []
        await verified(one_item_plan("r-h", "node-1", now + timedelta(seconds=6), trigger=second), second)
        assert [(h.prefix_id, h.epoch) for h in await store.held("r-h")] == [(1, 0)]
    finally:
        await pool.close()


async def test_statistics_leave_out_the_chains_of_scopes_with_no_count_in_the_window(
    migrated_database: str,
) -> None:
    """A prompt revision deployed over keeps its chains for the retention; a plan reads none of them."""
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:
        since = 1_000
        scope_of = {}
        for rev, leaf_bucket in (("old", since - 1), ("new", since)):
            scope = scope_of[rev] = await pool.fetchval(
                "INSERT INTO scopes (tenant, model, prompt_rev) VALUES ('acme', $1, $2) RETURNING scope_id",
                MODEL.name,
                rev,
            )
            base = 100 if rev == "old" else 200
            await pool.execute(
                "INSERT INTO prefix_chains (scope_id, nodes) VALUES ($1, $2)",
                scope,
                pack_runs([(None, 0, [base, base + 1], [16, 32])]),
            )
            await pool.execute(
                "INSERT INTO prefix_stats (scope_id, prefix_id, bucket, requests) VALUES ($1, $2, $3, 4)",
                scope,
                base + 1,
                leaf_bucket,
            )
            await pool.execute(
                "INSERT INTO prefix_catalog (scope_id, prefix_id, payload, payload_bytes, tokens, first_seen,"
                " last_seen) VALUES ($1, $2, '{}', 2, 16, now(), now())",
                scope,
                base,
            )
        store = PgPlanStore(pool)

        stats = await store.statistics(MODEL.name, since)
        new = scope_of["new"]
        assert sorted((scope, p.prefix_id, p.parent) for scope, p in stats.prefixes) == [
            (new, 200, None),
            (new, 201, 200),
        ]
        assert stats.counts == [(new, 201, since, 4)]
        assert stats.catalogued == {(new, 200)}
        # Counted a bucket earlier, the old revision's chain is read too.
        earlier = await store.statistics(MODEL.name, since - 1)
        assert {scope for scope, _ in earlier.prefixes} == {new, scope_of["old"]}
        assert earlier.catalogued == {(new, 200), (scope_of["old"], 100)}
        assert await store.statistics(MODEL.name, since + 1) == ModelStatistics([], [], set())
    finally:
        await pool.close()
