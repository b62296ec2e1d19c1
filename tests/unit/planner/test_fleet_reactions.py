"""Fleet reactions with in-memory parts: deploys bump epochs once per revision and plan them, scaling
re-plans ready replicas, the cold-start alarm fires once per episode; and the pure rules behind them."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from tests.unit.planner.memory_planner import BUCKET, MODEL, NOW, MemoryFleet, MemoryPlans, Published
from tests.unit.planner.planning_run import react
from warmplane.services.planner.core.cold_start import ColdStartMonitor, ColdStartRule, model_bucket_counts
from warmplane.services.planner.core.deploy_epochs import EpochState, Revisions, deploy_bumps
from warmplane.services.planner.core.ingest_batch import IngestBatch, RequestColumns
from warmplane.services.planner.fleet_reactions import FleetReactor
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.plan_choice import HeldItem, LiveReplica
from warmplane.services.planner.plans import PlanIssuer
from warmplane.services.planner.settings import ColdStartSettings, PlanSettings
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    DeployFinished,
    DeployStarted,
    EpochBumped,
    Event,
    FleetScaled,
    ModelRef,
    PrefixPayload,
    ReplicaDrainingStarted,
    ReplicaRewarmRequested,
)
from warmplane.shared.hash_ring import HashRing

RULE = ColdStartRule(alarm_ratio=0.3, clear_ratio=0.2, sustain_buckets=5, min_requests=5)


def test_the_alarm_fires_after_a_sustained_run_of_complete_cold_buckets_then_holds_until_clear() -> None:
    monitor = ColdStartMonitor(RULE)
    verdicts = []
    for bucket, (requests, cold) in enumerate(
        [(10, 5)] * 5 + [(10, 6), (10, 9), (10, 1), (10, 5)] + [(10, 5)] * 6
    ):
        monitor.observe("m", bucket, requests, cold)
        verdicts.append((bucket, v.kind if (v := monitor.judge("m")) else None))
    fired = [b for b, kind in verdicts if kind == "fired"]
    cleared = [b for b, kind in verdicts if kind == "cleared"]
    # Buckets 0-4 are complete once bucket 5 is seen; bucket 7 (10%) clears when 8 is seen; 8-12 complete
    # when 13 is seen: fires again. Never twice without a clear in between.
    assert (fired, cleared) == ([5, 13], [8])


def test_a_gap_or_a_thin_bucket_breaks_the_run() -> None:
    monitor = ColdStartMonitor(RULE)
    for bucket in [0, 1, 2, 4, 5, 6]:  # bucket 3 had no requests
        monitor.observe("m", bucket, 10, 9)
    assert monitor.judge("m") is None
    thin = ColdStartMonitor(RULE)
    for bucket in range(6):
        thin.observe("m", bucket, 4 if bucket == 2 else 10, 4 if bucket == 2 else 9)
    assert thin.judge("m") is None


def test_rules_refuse_inverted_thresholds() -> None:
    with pytest.raises(ValueError, match="clear_ratio"):
        ColdStartRule(alarm_ratio=0.2, clear_ratio=0.3, sustain_buckets=5, min_requests=1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 20), st.integers(0, 20)), max_size=80))
def test_firings_and_clears_alternate(observations: list[tuple[int, int, int]]) -> None:
    monitor = ColdStartMonitor(RULE)
    kinds = []
    for bucket, requests, cold in observations:
        monitor.observe("m", bucket, requests, min(cold, requests))
        if (verdict := monitor.judge("m")) is not None:
            kinds.append(verdict.kind)
            assert verdict.kind != "fired" or verdict.ratio > RULE.alarm_ratio
    assert all(a != b for a, b in itertools.pairwise(kinds))
    assert not kinds or kinds[0] == "fired"


@given(st.lists(st.tuples(st.integers(0, 2**40), st.booleans()), max_size=10))
def test_deploy_bumps_only_rise_by_one_and_spare_tenants_at_these_revisions(
    states: list[tuple[int, bool]],
) -> None:
    deployed = Revisions("w2", ("p1",))
    given_states = [
        EpochState(f"t{i}", epoch, deployed if same else None) for i, (epoch, same) in enumerate(states)
    ]
    bumps = deploy_bumps(given_states, deployed)
    assert [t for t, _, _ in bumps] == [s.tenant for s in given_states if s.deployed != deployed]
    assert all(following == current + 1 for _, current, following in bumps)


def deploy(
    kind: type[DeployStarted | DeployFinished], revision: str, prompts: list[str], tenant: str = ""
) -> DeployStarted | DeployFinished:
    return kind(
        event_id=new_event_id(),
        occurred_at=NOW,
        producer="ci",
        tenant=tenant,
        model=ModelRef(MODEL.name, revision),
        prompt_revs=prompts,
    )


def fleet(**plans: object) -> tuple[MemoryPlans, MemoryFleet, Published, PlannerMetrics, FleetReactor]:
    store = MemoryPlans(
        [(1, 5, None, 100), (2, 6, None, 100)],
        [(1, 5, BUCKET, 9), (2, 6, BUCKET, 9)],
        {(1, 5): PrefixPayload(5, prompt="one"), (2, 6): PrefixPayload(6, prompt="two")},
    )
    store.live = [LiveReplica("r", "node-r", "w1", "ready", None)]
    fleet_store = MemoryFleet(store, ["tenant-1", "tenant-2"])
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    issuer = PlanIssuer(
        store=store,
        publisher=published,
        # Prefixes of 100 tokens: no floor on a plan's expected saving (test_warm_decision's).
        settings=PlanSettings.model_validate({"min_expected_saved_tokens": 0, **plans}),
        bucket_seconds=60,
        metrics=metrics,
        clock=lambda: NOW,
    )
    reactor = FleetReactor(
        issuer=issuer,
        store=fleet_store,
        publisher=published,
        cold_start=ColdStartSettings(),
        bucket_seconds=60,
        metrics=metrics,
        clock=lambda: NOW,
    )
    return store, fleet_store, published, metrics, reactor


def test_a_deploy_bumps_every_tenant_once_publishes_the_bumps_and_plans_the_new_epochs() -> None:
    store, fleet_store, published, metrics, reactor = fleet()
    started = deploy(DeployStarted, "w2", ["p1"])
    finished = deploy(DeployFinished, "w2", ["p1"])
    asyncio.run(react(reactor, IngestBatch(fleet_changes=[started, finished, started])))

    assert store.epochs == {("tenant-1", "m"): 1, ("tenant-2", "m"): 1}
    bumps: list[Event] = [e for e in published.events if isinstance(e, EpochBumped)]
    assert sorted((b.tenant, b.epoch, b.producer) for b in bumps) == [
        ("tenant-1", 1, "planner"),
        ("tenant-2", 1, "planner"),
    ]
    assert all(at is not None for _, at in fleet_store.bumps.values())  # the broker took them
    # One plan per bump on the live replica, each of its tenant's prefix at the new epoch.
    assert sorted(
        (p.tenant, p.epoch, [(i.prefix_id, i.epoch) for i in p.items]) for p in published.plans
    ) == [
        ("tenant-1", 1, [(5, 1)]),
        ("tenant-2", 1, [(6, 1)]),
    ]
    assert metrics.epoch_bumps.labels(reason="deploy")._value.get() == 2

    # Its own bumps coming back through the lifecycle topic plan nothing more.
    asyncio.run(react(reactor, IngestBatch(fleet_changes=bumps)))
    assert len(published.plans) == 2
    # A prompt revision of one tenant bumps that tenant only.
    asyncio.run(react(reactor, IngestBatch(fleet_changes=[deploy(DeployStarted, "w2", ["p2"], "tenant-2")])))
    assert store.epochs == {("tenant-1", "m"): 1, ("tenant-2", "m"): 2}


def test_a_bump_the_broker_did_not_take_is_published_by_catch_up() -> None:
    _store, _fleet, published, _metrics, reactor = fleet()
    published.down = True
    asyncio.run(react(reactor, IngestBatch(fleet_changes=[deploy(DeployStarted, "w2", [], "tenant-1")])))
    assert published.events == [] and published.plans == []
    published.down = False
    assert asyncio.run(reactor.catch_up(0.0)) == 0  # recorded at NOW: not older than NOW
    reactor._clock = lambda: NOW.replace(minute=1)
    assert asyncio.run(reactor.catch_up(5.0)) == 1
    [bump] = published.events
    assert isinstance(bump, EpochBumped) and (bump.tenant, bump.epoch) == ("tenant-1", 1)
    assert asyncio.run(reactor.catch_up(5.0)) == 0


def test_scaling_down_plans_ready_replicas_for_what_they_lack_only_and_scaling_up_plans_none() -> None:
    store, _fleet, published, _metrics, reactor = fleet()
    store.live.append(LiveReplica("s", "node-s", "w1", "starting", None))
    scaled = FleetScaled(
        event_id=new_event_id(), occurred_at=NOW, producer="k8s", model=MODEL, from_replicas=1, to_replicas=2
    )
    store.holding = {"r": [HeldItem(5, "tenant-1", 0)]}
    asyncio.run(react(reactor, IngestBatch(fleet_changes=[scaled])))
    # The starting replica waits for its start's plan; the ready one only loses keys to it: no plan,
    # though the planner does not know that r holds 6.
    assert published.plans == []
    store.live.pop()  # the starting replica went away: r's share is everything again
    down = FleetScaled(
        event_id=new_event_id(), occurred_at=NOW, producer="k8s", model=MODEL, from_replicas=2, to_replicas=1
    )
    asyncio.run(react(reactor, IngestBatch(fleet_changes=[down])))
    assert [(p.replica, [i.prefix_id for i in p.items]) for p in published.plans] == [("r", [6])]
    published.plans.clear()
    store.holding = {"r": [HeldItem(5, "tenant-1", 0), HeldItem(6, "tenant-2", 0)]}
    again = FleetScaled(
        event_id=new_event_id(), occurred_at=NOW, producer="k8s", model=MODEL, from_replicas=3, to_replicas=2
    )
    asyncio.run(react(reactor, IngestBatch(fleet_changes=[again])))
    assert published.plans == []  # it holds everything: no plan


def test_a_draining_replica_s_keys_are_planned_on_the_ready_replicas_that_take_them() -> None:
    store, _fleet, published, _metrics, reactor = fleet()
    owned_by_s = sorted(prefix for prefix in (5, 6) if HashRing(["r", "s"]).owner(prefix) == "s")
    assert owned_by_s, "the ring gives s no prefix: pick other names"
    store.holding = {"r": [HeldItem(p, f"tenant-{p - 4}", 0) for p in (5, 6) if p not in owned_by_s]}
    store.live.append(LiveReplica("s", "node-s", "w1", "draining", None))  # as the batch committed it
    drain = ReplicaDrainingStarted(
        event_id=new_event_id(),
        occurred_at=NOW,
        producer="warmer/node-s",
        model=MODEL,
        replica="s",
        node="node-s",
    )

    asyncio.run(react(reactor, IngestBatch(replica_events=[drain])))

    assert [(p.replica, [i.prefix_id for i in p.items]) for p in published.plans] == [("r", owned_by_s)]
    published.plans.clear()
    asyncio.run(react(reactor, IngestBatch(replica_events=[drain])))  # redelivered
    assert published.plans == []


def test_a_requested_rewarm_plans_that_replica_in_full_and_flags_the_plan() -> None:
    store, _fleet, published, _metrics, reactor = fleet()
    store.live.append(LiveReplica("s", "node-s", "w1", "ready", None))
    store.holding = {"s": [HeldItem(5, "tenant-1", 0), HeldItem(6, "tenant-2", 0)]}
    owned = sorted(prefix for prefix in (5, 6) if HashRing(["r", "s"]).owner(prefix) == "s")
    assert owned, "the ring gives s no prefix: pick other names"

    def rewarm(replica: str) -> ReplicaRewarmRequested:
        return ReplicaRewarmRequested(
            event_id=new_event_id(), occurred_at=NOW, producer="api:ci", model=MODEL, replica=replica
        )

    request = rewarm("s")
    asyncio.run(react(reactor, IngestBatch(fleet_changes=[request, rewarm("gone")])))
    # It holds both, yet gets its whole share again; a replica that is not live gets nothing.
    [plan] = published.plans
    assert (plan.replica, plan.rewarm, [i.prefix_id for i in plan.items]) == ("s", True, owned)
    assert plan.trigger_event_id is None
    published.plans.clear()
    asyncio.run(react(reactor, IngestBatch(fleet_changes=[request])))
    assert published.plans == []  # the same request again: already planned for it


def cold_batch(bucket: int, requests: int, cold: int) -> IngestBatch:
    """`requests` requests in the 60 s `bucket`, the first `cold` of them with no cached token."""
    columns = RequestColumns(
        scopes=[("tenant-1", MODEL.name, "v1")] * requests,
        leaves=[5] * requests,
        seconds=[bucket * 60 + 0.5 + i / (2 * requests) for i in range(requests)],
        prompt_tokens=[100] * requests,
        cached_tokens=[0] * cold + [32] * (requests - cold),
        ttft_ms=[None] * requests,
    )
    return IngestBatch(requests=columns)


def test_a_cold_start_alarm_is_recorded_counted_and_re_plans_once_per_episode() -> None:
    _store, fleet_store, published, metrics, reactor = fleet()
    for bucket in range(BUCKET - 6, BUCKET):
        asyncio.run(react(reactor, cold_batch(bucket, 20, 15)))
    [alarm] = fleet_store.alarms
    assert (alarm["model"], alarm["requests"], alarm["cold"], alarm["planned"]) == (MODEL.name, 100, 75, 1)
    assert metrics.cold_start_alarms.labels(model=MODEL.name)._value.get() == 1
    [plan] = published.plans
    assert plan.replica == "r" and {i.prefix_id for i in plan.items} == {5, 6}
    for bucket in range(BUCKET, BUCKET + 6):  # still high: not re-fired
        asyncio.run(react(reactor, cold_batch(bucket, 20, 15)))
    assert len(fleet_store.alarms) == 1 and len(published.plans) == 1
    asyncio.run(react(reactor, cold_batch(BUCKET + 6, 20, 1)))
    asyncio.run(react(reactor, cold_batch(BUCKET + 7, 20, 1)))
    assert alarm["cleared_at"] == NOW


def test_an_alarm_that_could_not_be_recorded_fires_again_on_the_next_batch() -> None:
    _store, fleet_store, published, metrics, reactor = fleet()
    working = fleet_store.open_alarm

    async def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("connection reset")

    fleet_store.open_alarm = refuse  # type: ignore[method-assign]
    for bucket in range(BUCKET - 6, BUCKET):
        asyncio.run(react(reactor, cold_batch(bucket, 20, 15)))
    assert fleet_store.alarms == [] and metrics.plan_failures._value.get() == 1
    fleet_store.open_alarm = working  # type: ignore[method-assign]
    asyncio.run(react(reactor, cold_batch(BUCKET, 20, 15)))
    assert len(fleet_store.alarms) == 1 and len(published.plans) == 1


def test_a_disabled_alarm_watches_nothing() -> None:
    _store, fleet_store, published, metrics, reactor = fleet()
    quiet = FleetReactor(
        issuer=reactor._issuer, store=fleet_store, publisher=published,
        cold_start=ColdStartSettings(enabled=False), bucket_seconds=60, metrics=metrics, clock=lambda: NOW,
    )  # fmt: skip
    for bucket in range(BUCKET - 6, BUCKET + 1):
        asyncio.run(react(quiet, cold_batch(bucket, 20, 20)))
    assert fleet_store.alarms == [] and not quiet.monitor.firing(MODEL.name)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["m1", "m2", "m3"]), st.floats(0, 400), st.sampled_from([0, 0, 16])),
        max_size=40,
    ),
    st.sampled_from([60, 1000]),
)
def test_a_batch_is_summed_per_model_and_bucket_whether_it_spans_one_bucket_or_several(
    requests: list[tuple[str, float, int]], bucket_seconds: int
) -> None:
    columns = RequestColumns(
        scopes=[("acme", model, "") for model, _, _ in requests],
        seconds=[1_700_000_000 + at for _, at, _ in requests],
        cached_tokens=[cached for _, _, cached in requests],
    )
    expected: dict[tuple[str, int], list[int]] = {}
    for model, at, cached in requests:
        sums = expected.setdefault((model, int(1_700_000_000 + at) // bucket_seconds), [0, 0])
        sums[0] += 1
        sums[1] += cached == 0
    assert list(model_bucket_counts(columns, bucket_seconds)) == [
        (model, bucket, n, cold) for (model, bucket), (n, cold) in sorted(expected.items())
    ]
