"""Issuing plans with in-memory parts: what triggers a plan, what it holds, and that failures never
escape into the ingestion writer."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry

from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.core.simple_plan import Candidate, NodeKey, PrefixNode
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.plans import PlanIssuer, Unplanned
from warmplane.services.planner.settings import PlanSettings
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    EpochBumped,
    ModelRef,
    PrefixPayload,
    ReplicaBecameReady,
    ReplicaEvent,
    ReplicaStarted,
    WarmFinished,
    WarmItem,
    WarmPlanIssued,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
MODEL = ModelRef("m", "r1")


class MemoryPlans:
    def __init__(self, candidates: list[Candidate], payloads: dict[NodeKey, PrefixPayload]) -> None:
        self._candidates = candidates
        self._payloads = payloads
        self.rows: dict[tuple[uuid.UUID, str], WarmPlanIssued] = {}
        self.asked: list[tuple[str, int]] = []
        self.fail = False
        self.epochs: dict[str, int] = {}
        self.live: list[tuple[str, str]] = []
        self.published: dict[uuid.UUID, datetime] = {}
        self.unplanned: list[Unplanned] = []

    async def candidates(self, model: str, since_bucket: int) -> list[Candidate]:
        if self.fail:
            raise OSError("connection reset")
        self.asked.append((model, since_bucket))
        return self._candidates

    async def payloads(self, keys: Sequence[NodeKey]) -> dict[NodeKey, PrefixPayload]:
        return {key: self._payloads[key] for key in keys if key in self._payloads}

    async def scope_names(self, scope_ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        return {scope_id: (f"tenant-{scope_id}", "v1") for scope_id in scope_ids}

    async def current_epochs(self, model: str) -> dict[str, int]:
        return dict(self.epochs)

    async def live_replicas(self, model: str) -> list[tuple[str, str]]:
        return self.live

    async def record(self, plan: WarmPlanIssued, trigger_event_id: uuid.UUID) -> bool:
        return self.rows.setdefault((trigger_event_id, plan.replica), plan) is plan

    async def mark_published(self, plan_id: uuid.UUID, at: datetime) -> None:
        self.published.setdefault(plan_id, at)

    async def unpublished(self, *, issued_before: datetime, alive_at: datetime) -> list[WarmPlanIssued]:
        return [
            plan
            for plan in self.rows.values()
            if plan.plan_id not in self.published
            and plan.occurred_at < issued_before
            and plan.deadline > alive_at
        ]

    async def unplanned_starts(self, *, since: datetime, before: datetime) -> list[Unplanned]:
        planned = {trigger for trigger, _replica in self.rows}
        return [start for start in self.unplanned if start.trigger not in planned]

    async def standing(self, results: Sequence[WarmFinished]) -> list[WarmFinished]:
        return list(results)


class Published:
    def __init__(self) -> None:
        self.plans: list[WarmPlanIssued] = []
        self.down = False

    async def publish(self, plan: WarmPlanIssued) -> None:
        if self.down:
            raise TimeoutError("the broker did not acknowledge in time")
        self.plans.append(plan)


def replica_event(kind: type[ReplicaEvent], epoch: int | None) -> ReplicaEvent:
    return kind(
        event_id=new_event_id(),
        occurred_at=NOW,
        producer="w",
        model=MODEL,
        replica="r",
        node="n",
        epoch=epoch,
    )


def issuer(
    store: MemoryPlans, published: Published, metrics: PlannerMetrics, clock: list[datetime] | None = None
) -> PlanIssuer:
    """An issuer whose clock reads `clock[0]` (NOW if not given): a test moves time by replacing it."""
    now = clock if clock is not None else [NOW]
    return PlanIssuer(
        store=store,
        publisher=published,
        settings=PlanSettings(budget_tokens=250, deadline_s=90, window_hours=2),
        bucket_seconds=60,
        metrics=metrics,
        clock=lambda: now[0],
    )


def test_started_replicas_get_one_plan_each_and_other_transitions_none() -> None:
    swept = PrefixNode((1, 8), None, 0, 50)  # catalogued when chosen, its payload swept since
    nodes = [PrefixNode((1, 5), None, 0, 100), PrefixNode((2, 5), None, 0, 200), swept]
    store = MemoryPlans(
        [Candidate(nodes[0], 3, True), Candidate(nodes[1], 1, True), Candidate(swept, 9, True)],
        {(1, 5): PrefixPayload(5, prompt="hello"), (2, 5): PrefixPayload(5, prompt="other tenant")},
    )
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    store.epochs = {"tenant-1": 4}
    start = replica_event(ReplicaStarted, None)
    batch = IngestBatch(replica_events=[start, replica_event(ReplicaBecameReady, 4), start])
    asyncio.run(issuer(store, published, metrics).after_commit(batch))

    [plan] = published.plans
    # Chosen by value under 250 tokens: (1, 8) 450, (1, 5) 300; (2, 5) does not fit. (1, 8) lost its payload.
    # Each item names its tenant, prompt revision and the tenant's current epoch: the warmer derives the
    # cache_salt from them.
    assert plan.items == [WarmItem(5, 100, PrefixPayload(5, prompt="hello"), "tenant-1", "v1", 4)]
    assert plan.trigger_event_id == start.event_id
    assert (plan.epoch, plan.budget_tokens, plan.deadline) == (0, 250, NOW + timedelta(seconds=90))
    assert store.asked == [("m", int((NOW - timedelta(hours=2)).timestamp()) // 60)]
    assert metrics.plans_issued._value.get() == 1


def test_a_failing_store_is_counted_and_never_raised() -> None:
    store, published, metrics = MemoryPlans([], {}), Published(), PlannerMetrics(CollectorRegistry())
    store.fail = True
    batch = IngestBatch(replica_events=[replica_event(ReplicaStarted, 2)])
    asyncio.run(issuer(store, published, metrics).after_commit(batch))
    assert published.plans == [] and store.rows == {}
    assert metrics.plan_failures._value.get() == 1


def test_an_epoch_bump_plans_the_tenants_prefixes_on_every_live_replica_once() -> None:
    nodes = [PrefixNode((1, 5), None, 0, 100), PrefixNode((2, 6), None, 0, 100)]
    store = MemoryPlans(
        [Candidate(nodes[0], 3, True), Candidate(nodes[1], 9, True)],
        {(1, 5): PrefixPayload(5, prompt="tenant one"), (2, 6): PrefixPayload(6, prompt="tenant two")},
    )
    store.live = [("r-a", "node-1"), ("r-b", "node-2")]
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    bump = EpochBumped(
        event_id=new_event_id(), occurred_at=NOW, producer="api", tenant="tenant-1", model=MODEL, epoch=7
    )
    run = issuer(store, published, metrics)
    asyncio.run(run.after_commit(IngestBatch(fleet_changes=[bump])))
    asyncio.run(run.after_commit(IngestBatch(fleet_changes=[bump])))  # redelivered: nothing more

    assert [(plan.replica, plan.node) for plan in published.plans] == [("r-a", "node-1"), ("r-b", "node-2")]
    for plan in published.plans:
        # Only tenant-1's prefix, at the new epoch; no start to answer, so any incarnation may take it.
        assert plan.items == [WarmItem(5, 100, PrefixPayload(5, prompt="tenant one"), "tenant-1", "v1", 7)]
        assert (plan.epoch, plan.tenant, plan.trigger_event_id) == (7, "tenant-1", None)
    assert metrics.plans_issued._value.get() == 2


def test_a_plan_the_broker_did_not_take_is_published_again_once_by_catch_up() -> None:
    node = PrefixNode((1, 5), None, 0, 100)
    store = MemoryPlans([Candidate(node, 3, True)], {(1, 5): PrefixPayload(5, prompt="hello")})
    published, metrics, clock = Published(), PlannerMetrics(CollectorRegistry()), [NOW]
    run = issuer(store, published, metrics, clock)
    published.down = True
    start = replica_event(ReplicaStarted, None)
    asyncio.run(run.after_commit(IngestBatch(replica_events=[start])))
    [recorded] = store.rows.values()
    assert published.plans == [] and metrics.plan_failures._value.get() == 1

    published.down = False
    assert asyncio.run(run.catch_up()) == (0, 0)  # younger than the grace: still its batch's business
    clock[0] = NOW + timedelta(seconds=6)
    assert asyncio.run(run.catch_up()) == (1, 0)
    assert published.plans == [recorded]  # the same plan, the same id: a warmer applies it once
    assert store.published == {recorded.plan_id: clock[0]}
    assert asyncio.run(run.catch_up()) == (0, 0)


def test_a_start_whose_plan_was_never_recorded_is_planned_by_catch_up() -> None:
    node = PrefixNode((1, 5), None, 0, 100)
    store = MemoryPlans([Candidate(node, 3, True)], {(1, 5): PrefixPayload(5, prompt="hello")})
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    trigger = new_event_id()
    store.unplanned = [Unplanned("r-9", "node-2", MODEL, trigger)]

    assert asyncio.run(issuer(store, published, metrics).catch_up()) == (0, 1)

    [plan] = published.plans
    assert (plan.replica, plan.node, plan.trigger_event_id) == ("r-9", "node-2", trigger)
    assert asyncio.run(issuer(store, published, metrics).catch_up()) == (0, 0)
