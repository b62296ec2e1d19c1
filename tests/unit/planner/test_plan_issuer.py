"""Issuing plans with in-memory parts: what a plan holds (the policy core over the stored statistics, the
replica's ring share, its budget, what it holds), and that failures never escape into the ingestion
writer."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.unit.planner.memory_planner import BUCKET, MODEL, NOW, MemoryFleet, MemoryPlans, Published
from tests.unit.planner.planning_run import react
from warmplane.services.planner import plan_choice
from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.fleet_reactions import FleetReactor
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.plan_choice import HeldItem, LiveReplica
from warmplane.services.planner.plans import PlanIssuer, Unplanned
from warmplane.services.planner.policy import ReuseCalibration, fit_calibration
from warmplane.services.planner.settings import ColdStartSettings, PlanRingSettings, PlanSettings
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    EpochBumped,
    PrefixPayload,
    ReplicaBecameReady,
    ReplicaEvent,
    ReplicaStarted,
    WarmItem,
)
from warmplane.shared.hash_ring import HashRing


def replica_event(kind: type[ReplicaEvent], epoch: int | None, replica: str = "r") -> ReplicaEvent:
    return kind(
        event_id=new_event_id(),
        occurred_at=NOW,
        producer="w",
        model=MODEL,
        replica=replica,
        node="n",
        epoch=epoch,
    )


def live(replica: str, state: str = "ready", capacity: int | None = None) -> LiveReplica:
    return LiveReplica(replica, f"node-{replica}", MODEL.revision, state, capacity)


def issuer(
    store: MemoryPlans,
    published: Published,
    metrics: PlannerMetrics,
    clock: list[datetime] | None = None,
    **plans: object,
) -> PlanIssuer:
    """An issuer whose clock reads `clock[0]` (NOW if not given): a test moves time by replacing it. Its
    counts decay with one half-life of 600 s (these tests are about issuing; the knobs have their own).
    Their few prefixes are too little history to fit a calibration, so scores go through the prior (a
    quarter of the Poisson chance): at a least probability of 0.1, one request in the window is not
    enough and three are."""
    now = clock if clock is not None else [NOW]
    settings = PlanSettings.model_validate(
        {
            "budget_tokens": 250,
            "deadline_s": 90,
            "window_hours": 2,
            "half_life_s": 600,
            "frequency_half_life_s": None,
            "min_reuse_probability": 0.1,
            "min_expected_saved_tokens": 0,  # prefixes of 100 tokens: no floor on a plan's saving
            **plans,
        }
    )
    return PlanIssuer(
        store=store,
        publisher=published,
        settings=settings,
        bucket_seconds=60,
        metrics=metrics,
        ring=PlanRingSettings(),
        clock=lambda: now[0],
    )


def reactor(
    run: PlanIssuer, store: MemoryPlans, published: Published, metrics: PlannerMetrics
) -> FleetReactor:
    return FleetReactor(
        issuer=run,
        store=MemoryFleet(store, []),
        publisher=published,
        cold_start=ColdStartSettings(),
        bucket_seconds=60,
        metrics=metrics,
        clock=lambda: NOW,
    )


def three_tenants() -> MemoryPlans:
    """tenant-1: root 5 (100 tokens, 3 requests) and root 8 (50 tokens, 9 requests, its payload swept);
    tenant-2: root 6 (200 tokens, 1 request: unlikely to be reused in the ramp window)."""
    return MemoryPlans(
        [(1, 5, None, 100), (1, 8, None, 50), (2, 6, None, 200)],
        [(1, 5, BUCKET, 3), (1, 8, BUCKET, 9), (2, 6, BUCKET, 1), (1, 5, BUCKET - 500, 40)],
        {(1, 5): PrefixPayload(5, prompt="hello"), (2, 6): PrefixPayload(6, prompt="other tenant")},
    )


def test_started_replicas_get_one_plan_each_and_other_transitions_none() -> None:
    store = three_tenants()
    store.catalogued = {(1, 5), (1, 8), (2, 6)}  # 8 was catalogued, its payload swept since
    store.live = [live("r", "starting")]
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    store.epochs = {("tenant-1", MODEL.name): 4}
    start = replica_event(ReplicaStarted, None)
    batch = IngestBatch(replica_events=[start, replica_event(ReplicaBecameReady, 4), start])
    run = issuer(store, published, metrics)
    asyncio.run(react(reactor(run, store, published, metrics), batch))

    [plan] = published.plans
    # By reuse probability: 8 (9 requests), then 5 (3); 6's one request is below the least probability.
    # 8 lost its payload. Each item names its tenant, prompt revision and the tenant's current epoch.
    assert plan.items == [WarmItem(5, 100, PrefixPayload(5, prompt="hello"), "tenant-1", "v1", 4)]
    assert plan.trigger_event_id == start.event_id
    # The capacity is unknown (no warmer reported one): the settings' budget alone.
    assert (plan.epoch, plan.budget_tokens, plan.deadline) == (0, 250, NOW + timedelta(seconds=90))
    # Only the window's buckets are read (the 40 old requests of 5 are outside it).
    assert store.asked == [("m", int((NOW - timedelta(hours=2)).timestamp()) // 60)]
    assert metrics.plans_issued._value.get() == 1


def test_a_plan_keeps_to_the_replicas_ring_share_and_a_fraction_of_its_kv_capacity() -> None:
    roots = list(range(100, 140))
    store = MemoryPlans(
        [(1, root, None, 10) for root in roots],
        [(1, root, BUCKET, 5) for root in roots],
        {(1, root): PrefixPayload(root, prompt=f"doc {root}") for root in roots},
    )
    store.live = [live("r-a", capacity=10_000), live("r-b", capacity=10_000)]
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    run = issuer(store, published, metrics, budget_tokens=100_000)
    # A third replica starts: planned for its share of the ring with it in, at the peers' capacity.
    asyncio.run(run.issue(replica_event(ReplicaStarted, None, replica="r-c")))  # type: ignore[arg-type]

    [plan] = published.plans
    ring = HashRing(["r-a", "r-b", "r-c"])  # the gateway's ring over the same replicas
    assert {item.prefix_id for item in plan.items} == {root for root in roots if ring.owner(root) == "r-c"}
    assert 0 < len(plan.items) < len(roots)
    assert plan.budget_tokens == 5_000  # half of 10,000 tokens of KV


def test_what_a_replica_holds_at_the_current_epoch_is_not_warmed_again() -> None:
    store = three_tenants()
    store.live = [live("r")]
    store.epochs = {("tenant-1", MODEL.name): 2}
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    run = issuer(store, published, metrics)
    store.holding = {"r": [HeldItem(5, "tenant-1", 2)]}
    assert asyncio.run(run.plan_live("m", new_event_id())) == []  # holds it all: no plan
    store.holding = {"r": [HeldItem(5, "tenant-1", 1)]}  # held in an old epoch: worthless now
    [plan] = asyncio.run(run.plan_live("m", new_event_id()))
    assert [(item.prefix_id, item.epoch) for item in plan.items] == [(5, 2)]


def test_a_failing_store_is_counted_and_never_raised() -> None:
    store, published, metrics = MemoryPlans(), Published(), PlannerMetrics(CollectorRegistry())
    store.fail = True
    batch = IngestBatch(replica_events=[replica_event(ReplicaStarted, 2)])
    run = issuer(store, published, metrics)
    asyncio.run(react(reactor(run, store, published, metrics), batch))
    assert published.plans == [] and store.rows == {}
    assert metrics.plan_failures._value.get() == 1


def test_an_epoch_bump_plans_the_tenants_prefixes_on_every_live_replica_once() -> None:
    store = MemoryPlans(
        [(1, 5, None, 100), (2, 6, None, 100)],
        [(1, 5, BUCKET, 3), (2, 6, BUCKET, 9)],
        {(1, 5): PrefixPayload(5, prompt="tenant one"), (2, 6): PrefixPayload(6, prompt="tenant two")},
    )
    store.live = [live("r-a", "starting"), live("r-b"), live("r-c", "draining")]
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    bump = EpochBumped(
        event_id=new_event_id(), occurred_at=NOW, producer="api", tenant="tenant-1", model=MODEL, epoch=7
    )
    run = issuer(store, published, metrics)
    fleet_reactor = reactor(run, store, published, metrics)
    asyncio.run(react(fleet_reactor, IngestBatch(fleet_changes=[bump])))
    asyncio.run(react(fleet_reactor, IngestBatch(fleet_changes=[bump])))  # redelivered: nothing more

    # Tenant-1's one prefix goes to its ring owner among the live replicas (the draining one is out);
    # the other replica would warm nothing for this bump, so it gets no plan.
    owner = HashRing(["r-a", "r-b"]).owner(5)
    [plan] = published.plans
    # Only tenant-1's prefix, at the new epoch; no start to answer, so any incarnation may take it.
    assert plan.items == [WarmItem(5, 100, PrefixPayload(5, prompt="tenant one"), "tenant-1", "v1", 7)]
    assert (plan.replica, plan.epoch, plan.tenant, plan.trigger_event_id) == (owner, 7, "tenant-1", None)
    assert metrics.plans_issued._value.get() == 1


def test_a_plan_the_broker_did_not_take_is_published_again_once_by_catch_up() -> None:
    store = three_tenants()
    store.live = [live("r", "starting")]
    published, metrics, clock = Published(), PlannerMetrics(CollectorRegistry()), [NOW]
    run = issuer(store, published, metrics, clock)
    published.down = True
    asyncio.run(run.issue(replica_event(ReplicaStarted, None)))  # type: ignore[arg-type]
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
    store = three_tenants()
    store.live = [live("r-9", "loading")]
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    trigger = new_event_id()
    store.unplanned = [Unplanned("r-9", "node-2", MODEL, trigger)]

    assert asyncio.run(issuer(store, published, metrics).catch_up()) == (0, 1)

    [plan] = published.plans
    assert (plan.replica, plan.node, plan.trigger_event_id) == ("r-9", "node-2", trigger)
    assert [item.prefix_id for item in plan.items] == [5]
    assert asyncio.run(issuer(store, published, metrics).catch_up()) == (0, 0)


def started(replica: str) -> ReplicaStarted:
    return ReplicaStarted(
        event_id=new_event_id(), occurred_at=NOW, producer="w", model=MODEL, replica=replica, node="n"
    )


def owner_of(key: int, members: list[str]) -> str:
    """The first of r0, r1, ... that the ring of `members` and it sends `key` to."""
    return next(
        name for name in (f"r{i}" for i in range(100)) if HashRing([*members, name]).owner(key) == name
    )


def test_plans_within_the_statistics_age_share_one_read_and_still_see_the_fleet_as_it_is() -> None:
    """A rolling deploy starts replicas one after another: their plans share one read of the counts,
    while each plan is for its replica's share of the replicas live at that plan."""
    store = three_tenants()
    store.payload_of[(2, 6)] = PrefixPayload(6, prompt="other tenant")
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    clock = [NOW]
    run = issuer(store, published, metrics, clock, statistics_max_age_s=10)
    store.live = [live("a", "starting")]
    assert asyncio.run(run.issue(started("a"))) is not None
    clock[0] = NOW + timedelta(seconds=9)
    store.counts.append((2, 6, BUCKET, 500))  # root 6 turns hot, after the read
    second = owner_of(6, ["a"])  # the ring sends 6 to the second replica
    store.live = [live("a"), live(second, "starting")]
    plan = asyncio.run(run.issue(started(second)))
    assert len(store.asked) == 1
    assert plan is not None and 6 not in {item.prefix_id for item in plan.items}  # too young for the read
    clock[0] = NOW + timedelta(seconds=10)
    third = owner_of(6, ["a", second])
    store.live = [live("a"), live(second), live(third, "starting")]
    plan = asyncio.run(run.issue(started(third)))
    assert len(store.asked) == 2  # the read aged out
    assert plan is not None and 6 in {item.prefix_id for item in plan.items}


def test_a_statistics_age_of_zero_reads_the_counts_for_every_plan() -> None:
    store = three_tenants()
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    run = issuer(store, published, metrics, statistics_max_age_s=0)
    store.live = [live("a", "starting"), live("b", "starting")]
    asyncio.run(run.issue(started("a")))
    asyncio.run(run.issue(started("b")))
    assert len(store.asked) == 2


def test_a_calibration_serves_the_reads_of_its_max_age_and_is_then_fitted_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every plan here reads the counts (no kept read); only the first read of each `calibration_max_age_s`
    fits the map from score to reuse, per (model, tenant)."""
    fitted: list[float] = []

    def counting_fit(*args: Any) -> ReuseCalibration:
        fitted.append(args[2])
        return fit_calibration(*args)

    monkeypatch.setattr(plan_choice, "fit_calibration", counting_fit)
    store = three_tenants()
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    clock = [NOW]
    run = issuer(store, published, metrics, clock, statistics_max_age_s=0, calibration_max_age_s=30)
    store.live = [live("a", "starting"), live("b", "starting"), live("c", "starting")]
    asyncio.run(run.issue(started("a")))
    clock[0] = NOW + timedelta(seconds=29)
    asyncio.run(run.issue(started("b")))
    assert (len(store.asked), fitted) == (2, [NOW.timestamp()])
    bump = EpochBumped(
        event_id=new_event_id(), occurred_at=NOW, producer="api", tenant="tenant-1", model=MODEL, epoch=2
    )
    asyncio.run(run.replan(bump))  # one tenant's counts: a calibration of their own
    assert fitted == [NOW.timestamp(), clock[0].timestamp()]
    clock[0] = NOW + timedelta(seconds=30)
    asyncio.run(run.issue(started("c")))
    assert fitted == [NOW.timestamp(), (NOW + timedelta(seconds=29)).timestamp(), clock[0].timestamp()]


def test_a_re_plan_reads_the_counts_afresh_even_just_after_a_start() -> None:
    """A bump, an alarm or a fleet change re-plans because what is known changed: no kept read."""
    store = three_tenants()
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    run = issuer(store, published, metrics, statistics_max_age_s=60)
    store.live = [live("a", "starting")]
    asyncio.run(run.issue(started("a")))
    bump = EpochBumped(
        event_id=new_event_id(), occurred_at=NOW, producer="api", tenant="tenant-1", model=MODEL, epoch=2
    )
    asyncio.run(run.replan(bump))
    asyncio.run(run.plan_live(MODEL.name, new_event_id()))
    assert len(store.asked) == 3
    asyncio.run(run.issue(started("b")))  # a start may use the latest read, the re-plan's
    assert len(store.asked) == 3


def test_a_read_stops_where_counts_stop_weighing() -> None:
    """24 hours allowed, but a count older than 12 half-lives (2 h at 600 s) weighs under 2 ** -12: the
    read stops there (root 5's 40 requests of 8 hours ago are not read)."""
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    store = three_tenants()
    store.live = [live("r", "starting")]
    plan = asyncio.run(issuer(store, published, metrics, window_hours=24).issue(started("r")))
    [(_, since_bucket)] = store.asked
    assert since_bucket == int((NOW - timedelta(hours=2)).timestamp()) // 60
    assert BUCKET - 500 < since_bucket <= BUCKET
    assert plan is not None and [item.prefix_id for item in plan.items] == [5]
