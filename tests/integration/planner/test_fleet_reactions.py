"""Fleet reactions on real parts: a deploy bumps the epoch and the warmer warms the new one on vLLM; a
scale-up's new replica is warmed before it turns ready; the cold-start alarm fires once and re-plans.

The vLLM tests share the session's engine (a second replica is the same engine under another name: what
is tested is the plans and the readiness, and engine starts are slow on this CPU).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import asyncpg

from tests.integration.planner.test_planner_plans import payload
from tests.integration.planner_harness import MODEL, events_by_time, poll_until, produce, request
from tests.integration.warmer_harness import (
    conversation_traffic,
    counted,
    ready_status,
    real_chat,
    wait_for,
    warmer_settings,
)
from warmplane.services.devstack.fleet import engine_settings
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.settings import PlannerSettings
from warmplane.services.warmer.service import Warmer
from warmplane.shared.cache_salt import derive_cache_salt
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    DeployFinished,
    DeployStarted,
    EpochBumped,
    Event,
    FleetScaled,
    ModelRef,
    ReplicaBecameReady,
    ReplicaEvent,
    ReplicaStarted,
    WarmFinished,
    WarmPlanIssued,
)
from warmplane.shared.hash_ring import HashRing
from warmplane.shared.topics import Topics

_TIMEOUT_S = 60.0


async def _value(dsn: str, query: str) -> object:
    db = await asyncpg.connect(dsn)
    try:
        return await db.fetchval(query)
    finally:
        await db.close()


def _deploy(kind: type[DeployStarted | DeployFinished], revision: str) -> DeployStarted | DeployFinished:
    return kind(
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="ci",
        model=ModelRef(MODEL.name, revision),
        prompt_revs=["system-prompt-2"],
    )


async def test_a_deploy_bumps_the_epoch_and_the_warmer_warms_the_new_one(
    planner_settings: PlannerSettings, vllm_engine: EmbeddedVllm
) -> None:
    rng = random.Random(uuid.uuid4().int)
    secret = uuid.uuid4().hex
    kafka = planner_settings.kafka
    topics = Topics(kafka.topic_prefix)
    traffic, payloads = conversation_traffic(rng, 3, repeats=3)
    await produce(kafka, traffic)
    dsn = planner_settings.postgres.asyncpg_dsn()
    settings = warmer_settings(kafka, [vllm_engine], node="node-d", secrets={"acme": secret})
    async with running_planner(planner_settings):
        await poll_until(lambda: counted(dsn, len(traffic)), timeout_s=_TIMEOUT_S, what="traffic")
        async with Warmer(settings) as warmer:
            [driver] = warmer.drivers.values()
            await wait_for(lambda: driver.tracker.ready, timeout_s=_TIMEOUT_S, what="the replica ready")

            # The rollout starts and finishes: one bump, made by the planner, and the warmer warms epoch 1.
            await produce(kafka, [_deploy(DeployStarted, "rev-2"), _deploy(DeployFinished, "rev-2")])
            await wait_for(
                lambda: sum(key[3] == 1 for key in driver.tracker.held) == len(payloads),
                timeout_s=_TIMEOUT_S,
                what="the new epoch warmed",
            )
            salt = derive_cache_salt(secret.encode(), "acme", MODEL.name, 1)
            for messages in payloads.values():
                usage = await real_chat(vllm_engine, messages, salt)
                assert usage["prompt_tokens_details"]["cached_tokens"] > 0
        epoch = "SELECT epoch FROM epochs WHERE tenant = 'acme'"
        assert await _value(dsn, epoch) == 1
        published = "SELECT count(*) FROM epochs WHERE published_at IS NOT NULL"
        assert await _value(dsn, published) == 1

    bumps = [e for e in await events_by_time(kafka, topics.lifecycle) if isinstance(e, EpochBumped)]
    assert [(b.tenant, b.epoch, b.producer, b.model.revision) for b in bumps] == [
        ("acme", 1, "planner", "rev-2")
    ]
    plans = [e for e in await events_by_time(kafka, topics.plans) if isinstance(e, WarmPlanIssued)]
    assert [(p.epoch, {i.epoch for i in p.items}, len(p.items)) for p in plans] == [
        (0, {0}, len(payloads)),
        (1, {1}, len(payloads)),
    ]


async def test_a_deploy_bumps_each_tenant_once_per_revision_in_postgres_and_on_the_topic(
    planner_settings: PlannerSettings,
) -> None:
    kafka = planner_settings.kafka
    topics = Topics(kafka.topic_prefix)
    dsn = planner_settings.postgres.asyncpg_dsn()
    traffic = [request([700], tenant="acme"), request([800], tenant="globex")]
    bumped = "SELECT count(*) FROM fleet_changes WHERE type = 'epoch.bumped'"
    async with running_planner(planner_settings):
        await produce(kafka, traffic)
        await poll_until(lambda: counted(dsn, 2), timeout_s=_TIMEOUT_S, what="traffic")
        # started and finished of one rollout, then a redelivered started: one bump per tenant.
        started = _deploy(DeployStarted, "rev-2")
        await produce(kafka, [started, _deploy(DeployFinished, "rev-2"), started])
        # The planner's own bumps come back through the lifecycle topic and are recorded as fleet changes.
        await poll_until(lambda: _is(dsn, bumped, 2), timeout_s=_TIMEOUT_S, what="the bumps recorded")
        await produce(kafka, [_deploy(DeployStarted, "rev-3")])
        await poll_until(lambda: _is(dsn, bumped, 4), timeout_s=_TIMEOUT_S, what="the second rollout")
        rows = await _rows(
            dsn, "SELECT tenant, epoch, model_revision, prompt_revs FROM epochs ORDER BY tenant"
        )
        assert rows == [
            ("acme", 2, "rev-3", ["system-prompt-2"]),
            ("globex", 2, "rev-3", ["system-prompt-2"]),
        ]
        unpublished = "SELECT count(*) FROM epochs WHERE published_at IS NULL"
        assert await _value(dsn, unpublished) == 0

    bumps = [e for e in await events_by_time(kafka, topics.lifecycle) if isinstance(e, EpochBumped)]
    assert sorted((b.tenant, b.epoch) for b in bumps) == [
        ("acme", 1),
        ("acme", 2),
        ("globex", 1),
        ("globex", 2),
    ]


async def _rows(dsn: str, query: str) -> list[tuple[object, ...]]:
    db = await asyncpg.connect(dsn)
    try:
        return [tuple(row) for row in await db.fetch(query)]
    finally:
        await db.close()


async def test_a_scaled_up_replica_is_warmed_before_it_turns_ready(
    planner_settings: PlannerSettings, vllm_engine: EmbeddedVllm
) -> None:
    rng = random.Random(uuid.uuid4().int)
    kafka = planner_settings.kafka
    topics = Topics(kafka.topic_prefix)
    traffic, payloads = conversation_traffic(rng, 20, repeats=3)
    await produce(kafka, traffic)
    dsn = planner_settings.postgres.asyncpg_dsn()
    settings = warmer_settings(kafka, [vllm_engine], node="node-s", secrets={"acme": uuid.uuid4().hex})
    async with running_planner(planner_settings):
        await poll_until(lambda: counted(dsn, len(traffic)), timeout_s=_TIMEOUT_S, what="traffic")
        async with Warmer(settings) as warmer:
            [first] = warmer.drivers.values()
            await wait_for(lambda: first.tracker.ready, timeout_s=_TIMEOUT_S, what="the first replica ready")
            verified = "SELECT count(*) FROM warm_plans WHERE state = 'verified'"
            await poll_until(lambda: _is(dsn, verified, 1), timeout_s=_TIMEOUT_S, what="its plan verified")

            # The fleet scales to two: the new replica is announced, planned for its share, warmed, ready.
            scaled = FleetScaled(
                event_id=new_event_id(), occurred_at=datetime.now(UTC), producer="k8s", model=MODEL,
                from_replicas=1, to_replicas=2,
            )  # fmt: skip
            await produce(kafka, [scaled])
            second = warmer.add_engine(engine_settings(vllm_engine, "node-s-r1"))
            assert await ready_status(warmer.http_port, second.replica) == 503
            await wait_for(lambda: second.tracker.ready, timeout_s=_TIMEOUT_S, what="the new replica ready")
            assert not second.tracker.partial, second.tracker.reason

    events = await events_by_time(kafka, topics.lifecycle)
    new = [e for e in events if isinstance(e, ReplicaEvent) and e.replica == "node-s-r1"]
    assert [type(e).STATE for e in new] == ["starting", "loading", "warming", "ready"]
    plans = [e for e in await events_by_time(kafka, topics.plans) if isinstance(e, WarmPlanIssued)]
    # The first replica took everything alone; the scale-up gave it nothing new to warm (its share only
    # shrank), so its only plan is its start's.
    assert [p.replica for p in plans] == [first.replica, "node-s-r1"]
    ring = HashRing([first.replica, "node-s-r1"])
    share = {leaf for leaf in payloads if ring.owner(_root_of(traffic, leaf)) == "node-s-r1"}
    assert {i.prefix_id for i in plans[0].items} == set(payloads)
    assert {i.prefix_id for i in plans[1].items} == share and share
    finished = {
        e.plan_id: e for e in await events_by_time(kafka, topics.warm_results) if isinstance(e, WarmFinished)
    }
    became_ready = next(e for e in new if isinstance(e, ReplicaBecameReady))
    result = finished[plans[1].plan_id]
    assert result.verified_hits == len(share) and result.occurred_at <= became_ready.occurred_at


def _root_of(traffic: Sequence[Event], leaf: int) -> int:
    """The routing key (depth 0: the root) of the conversation ending at `leaf`."""
    for event in traffic:
        chain = getattr(event, "chain", [])
        if chain and chain[-1] == leaf:
            return int(chain[0])
    raise AssertionError(f"no request ends at {leaf}")


async def test_the_cold_start_alarm_fires_once_records_itself_and_re_plans(
    planner_settings: PlannerSettings,
) -> None:
    kafka = planner_settings.kafka
    topics = Topics(kafka.topic_prefix)
    dsn = planner_settings.postgres.asyncpg_dsn()
    now = datetime.now(UTC)
    start = ReplicaStarted(
        event_id=new_event_id(), occurred_at=now, producer="warmer", model=MODEL, replica="r-c", node="node-c"
    )
    ready = ReplicaBecameReady(
        event_id=new_event_id(), occurred_at=now, producer="warmer", model=MODEL, replica="r-c", node="node-c"
    )
    # Eight minutes of event time, 10 requests a minute, 8 of them cold, the first of each catalogued.
    base = now - timedelta(minutes=9)

    def minute(m: int, cold: int) -> list[Event]:
        at = base + timedelta(minutes=m)
        return [
            request(
                [500 + i],
                at=at,
                cached_tokens=0 if i < cold else 50,
                payload=payload(500 + i) if m == 0 else None,
            )
            for i in range(10)
        ]

    async with running_planner(planner_settings) as planner:
        await produce(kafka, [start, ready])
        await poll_until(
            lambda: _is(dsn, "SELECT state FROM replicas", "ready"), timeout_s=_TIMEOUT_S, what="ready"
        )
        for m in range(7):
            await produce(kafka, minute(m, cold=8))
        alarms = "SELECT count(*) FROM cold_start_alarms"
        await poll_until(lambda: _is(dsn, alarms, 1), timeout_s=_TIMEOUT_S, what="the alarm")
        await poll_until(
            lambda: _is(dsn, "SELECT replicas_planned FROM cold_start_alarms", 1),
            timeout_s=_TIMEOUT_S,
            what="re-plan",
        )
        # Still cold for two more minutes: the open alarm is not fired again.
        for m in (7, 8):
            await produce(kafka, minute(m, cold=9))
        await poll_until(lambda: counted(dsn, 90), timeout_s=_TIMEOUT_S, what="all counted")
        assert await _value(dsn, alarms) == 1
        assert await _value(dsn, "SELECT cleared_at IS NULL FROM cold_start_alarms") is True
        assert await _value(dsn, "SELECT requests FROM cold_start_alarms") == 50
        fired = planner.metrics.cold_start_alarms.labels(model=MODEL.name)._value.get()
        assert fired == 1

    plans = [e for e in await events_by_time(kafka, topics.plans) if isinstance(e, WarmPlanIssued)]
    # The start's plan (nothing known yet), then the alarm's: the catalogued prefixes of the cold traffic.
    assert [(p.replica, len(p.items)) for p in plans] == [("r-c", 0), ("r-c", 10)]
    assert plans[1].trigger_event_id is None


async def _is(dsn: str, query: str, expected: object) -> bool:
    return await _value(dsn, query) == expected
