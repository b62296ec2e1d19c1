"""The loop end to end on real parts: request events -> planner -> plan -> warmer -> vLLM -> ready; and the
loop cut midway (an engine killed, a warmer restarted: issue 21's fault suite).

Conversations are random words from a generator seeded afresh per test and salts come from a fresh
secret, so tests sharing the session's engine never find each other's blocks. Expectations come from the
measured rule (NOTES-parts): a real request whose prompt starts with a warmed rendering of `t` tokens finds
`32 * (t // 32)` of them cached.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg

from tests.integration.planner_harness import MODEL, events_by_time, poll_until, produce
from tests.integration.warmer_harness import (
    Message,
    conversation,
    conversation_traffic,
    counted,
    full_blocks,
    ready_status,
    real_chat,
    wait_for,
    warmer_settings,
)
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.settings import PlannerSettings
from warmplane.services.warmer.core.replica import Phase
from warmplane.services.warmer.replica_driver import ReplicaDriver
from warmplane.services.warmer.service import Warmer
from warmplane.services.warmer.settings import WarmerSettings, WarmSettings
from warmplane.shared.cache_salt import derive_cache_salt
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, EmbeddedVllm
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    EpochBumped,
    ReplicaEvent,
    WarmFinished,
    WarmPlanIssued,
)
from warmplane.shared.topics import Topics

_TIMEOUT_S = 60.0


async def _fetch(dsn: str, query: str) -> list[tuple[object, ...]]:
    db = await asyncpg.connect(dsn)
    try:
        return [tuple(row) for row in await db.fetch(query)]
    finally:
        await db.close()


async def _plan_states(dsn: str, expected: list[str]) -> bool:
    rows = await _fetch(dsn, "SELECT state FROM warm_plans ORDER BY issued_at")
    return [row[0] for row in rows] == expected


def epoch_bumped(tenant: str, epoch: int) -> EpochBumped:
    return EpochBumped(
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="test",
        tenant=tenant,
        model=MODEL,
        epoch=epoch,
        reason="a new system prompt",
    )


async def test_a_starting_replica_is_warmed_verified_and_only_then_ready(
    planner_settings: PlannerSettings, vllm_engine: EmbeddedVllm
) -> None:
    rng = random.Random(uuid.uuid4().int)
    secret = uuid.uuid4().hex
    kafka = planner_settings.kafka
    topics = Topics(kafka.topic_prefix)
    traffic, payloads = conversation_traffic(rng, 4, repeats=3)
    await produce(kafka, traffic)
    dsn = planner_settings.postgres.asyncpg_dsn()
    settings = warmer_settings(kafka, [vllm_engine], node="node-a", secrets={"acme": secret})
    async with running_planner(planner_settings):
        await poll_until(lambda: counted(dsn, len(traffic)), timeout_s=_TIMEOUT_S, what="traffic counted")
        async with Warmer(settings) as warmer:
            [driver] = warmer.drivers.values()
            assert await ready_status(warmer.http_port) == 503  # announced, not yet warm
            await wait_for(lambda: driver.tracker.ready, timeout_s=_TIMEOUT_S, what="the replica ready")
            assert await ready_status(warmer.http_port) == 200
            assert await ready_status(warmer.http_port, driver.replica) == 200
            assert await ready_status(warmer.http_port, "no-such-replica") == 404
            assert not driver.tracker.partial, driver.tracker.reason

            # A real request of each warmed conversation finds its full blocks cached, in acme's namespace.
            salt = derive_cache_salt(secret.encode(), "acme", MODEL.name, 0)
            for messages in payloads.values():
                usage = await real_chat(vllm_engine, messages, salt)
                expected = await full_blocks(vllm_engine, messages)
                assert expected >= 4 * BLOCK_SIZE
                assert usage["prompt_tokens_details"]["cached_tokens"] == expected
            # A conversation nobody planned finds nothing: the cache was not warm by accident.
            cold = await real_chat(vllm_engine, conversation(rng), salt)
            assert cold["prompt_tokens_details"]["cached_tokens"] == 0

            # acme's epoch moves on: the ready replica is planned again and warmed in the new namespace.
            await produce(kafka, [epoch_bumped("acme", 1)])
            await wait_for(
                lambda: sum(key[3] == 1 for key in driver.tracker.held) == len(payloads),
                timeout_s=_TIMEOUT_S,
                what="the new epoch warmed",
            )
            assert driver.tracker.ready
            salt_1 = derive_cache_salt(secret.encode(), "acme", MODEL.name, 1)
            for messages in payloads.values():
                usage = await real_chat(vllm_engine, messages, salt_1)
                assert usage["prompt_tokens_details"]["cached_tokens"] == await full_blocks(
                    vllm_engine, messages
                )
        # The planner recorded both plans' outcomes from the warmer's results, and the epoch.
        await poll_until(
            lambda: _plan_states(dsn, ["verified", "verified"]), timeout_s=_TIMEOUT_S, what="outcomes"
        )
        assert await _fetch(dsn, "SELECT tenant, model, epoch FROM epochs") == [("acme", MODEL.name, 1)]

    plan, replan = [e for e in await events_by_time(kafka, topics.plans) if isinstance(e, WarmPlanIssued)]
    assert {item.prefix_id for item in plan.items} == set(payloads)
    assert {(item.epoch, item.tenant) for item in plan.items} == {(0, "acme")}
    assert {(item.epoch, item.prefix_id) for item in replan.items} == {(1, prefix) for prefix in payloads}
    lifecycle = [e for e in await events_by_time(kafka, topics.lifecycle) if isinstance(e, ReplicaEvent)]
    assert [type(e).STATE for e in lifecycle] == ["starting", "loading", "warming", "ready"]
    assert (plan.trigger_event_id, replan.trigger_event_id) == (lifecycle[0].event_id, None)
    # From the weights loaded on, the lifecycle says how many tokens the engine's prefix cache holds.
    assert lifecycle[0].kv_capacity_tokens is None
    capacity = lifecycle[1].kv_capacity_tokens
    assert capacity is not None and capacity > 0 and capacity % BLOCK_SIZE == 0
    finished = [e for e in await events_by_time(kafka, topics.warm_results) if isinstance(e, WarmFinished)]
    assert [(f.plan_id, f.verified_hits, f.failures) for f in finished] == [
        (plan.plan_id, 4, []),
        (replan.plan_id, 4, []),
    ]
    assert finished[0].tokens_prefilled > 4 * 4 * BLOCK_SIZE


@dataclass(frozen=True, slots=True)
class _SlowWarm:
    """Conversations the planner has counted, and a warmer warming one item at a time (to cut midway)."""

    settings: WarmerSettings
    payloads: dict[int, list[Message]]
    secret: str


async def _slow_warm(planner_settings: PlannerSettings, engine: EmbeddedVllm, node: str) -> _SlowWarm:
    """Publish 40 conversations (twice each), wait until the running planner counted them, and the warmer's
    settings for `engine` on `node`."""
    rng = random.Random(uuid.uuid4().int)
    secret = uuid.uuid4().hex
    kafka = planner_settings.kafka
    traffic, payloads = conversation_traffic(rng, 40, repeats=2)
    await produce(kafka, traffic)
    dsn = planner_settings.postgres.asyncpg_dsn()
    await poll_until(lambda: counted(dsn, len(traffic)), timeout_s=_TIMEOUT_S, what="traffic")
    warm = WarmSettings(concurrency=1, health_interval_s=0.2, progress_interval_s=0.2, request_timeout_s=10)
    settings = warmer_settings(kafka, [engine], node=node, secrets={"acme": secret}, warm=warm)
    return _SlowWarm(settings, payloads, secret)


def _warming_midway(driver: ReplicaDriver) -> bool:
    report = driver.progress()
    return driver.tracker.phase is Phase.WARMING and report is not None and report.items_done >= 3


async def test_an_engine_killed_mid_warm_is_never_ready_and_is_rewarmed_when_it_returns(
    planner_settings: PlannerSettings, own_engine: EmbeddedVllm
) -> None:
    kafka = planner_settings.kafka
    topics = Topics(kafka.topic_prefix)
    async with running_planner(planner_settings):
        slow = await _slow_warm(planner_settings, own_engine, "node-k")
        async with Warmer(slow.settings) as warmer:
            [driver] = warmer.drivers.values()
            tracker = driver.tracker
            first = tracker.incarnation
            await wait_for(lambda: _warming_midway(driver), timeout_s=_TIMEOUT_S, what="the warm under way")
            own_engine.kill()
            readiness: list[bool] = []

            def crashed() -> bool:
                readiness.append(tracker.ready)
                return tracker.phase is Phase.FAILED

            await wait_for(crashed, timeout_s=_TIMEOUT_S, what="the crash noticed")
            assert await ready_status(warmer.http_port) == 503
            assert not any(readiness)

            own_engine.start()  # same port: the warmer sees the engine answer again
            await wait_for(lambda: tracker.ready, timeout_s=_TIMEOUT_S, what="ready after the restart")
            assert tracker.incarnation != first and not tracker.partial, tracker.reason
            salt = derive_cache_salt(slow.secret.encode(), "acme", MODEL.name, 0)
            messages = next(iter(slow.payloads.values()))
            usage = await real_chat(own_engine, messages, salt)
            expected = await full_blocks(own_engine, messages)
            assert usage["prompt_tokens_details"]["cached_tokens"] == expected

    lifecycle = [e for e in await events_by_time(kafka, topics.lifecycle) if isinstance(e, ReplicaEvent)]
    states = [type(e).STATE for e in lifecycle]
    assert states == ["starting", "loading", "warming", "failed", "starting", "loading", "warming", "ready"]
    plans = [e for e in await events_by_time(kafka, topics.plans) if isinstance(e, WarmPlanIssued)]
    assert [plan.trigger_event_id for plan in plans] == [lifecycle[0].event_id, lifecycle[4].event_id]
    results = [e for e in await events_by_time(kafka, topics.warm_results) if isinstance(e, WarmFinished)]
    by_plan = {result.plan_id: result for result in results}
    assert by_plan[plans[0].plan_id].partial and by_plan[plans[0].plan_id].failures
    assert by_plan[plans[1].plan_id].verified_hits == len(slow.payloads)


async def test_a_warmer_restarted_mid_plan_warms_the_new_start_once_and_only_then_is_ready(
    planner_settings: PlannerSettings, own_engine: EmbeddedVllm
) -> None:
    """A warmer restarted mid-plan, its engine still running: the new warmer
    announces the replica as a new start, the planner plans that start, the warm is applied once and
    verified, and only then is the replica ready. The cut-off run is never taken as done."""
    kafka = planner_settings.kafka
    topics = Topics(kafka.topic_prefix)
    async with running_planner(planner_settings):
        slow = await _slow_warm(planner_settings, own_engine, "node-r")
        async with Warmer(slow.settings) as first:
            [driver] = first.drivers.values()
            await wait_for(
                lambda: _warming_midway(driver), timeout_s=_TIMEOUT_S, what="the first warm under way"
            )
            assert not driver.tracker.ready
            earlier = driver.tracker.incarnation
        # The first warmer is gone mid-plan; the engine runs on.
        async with Warmer(slow.settings) as second:
            [driver] = second.drivers.values()
            await wait_for(lambda: driver.tracker.ready, timeout_s=_TIMEOUT_S, what="ready again")
            assert driver.tracker.incarnation != earlier and not driver.tracker.partial, driver.tracker.reason
            salt = derive_cache_salt(slow.secret.encode(), "acme", MODEL.name, 0)
            for messages in slow.payloads.values():
                usage = await real_chat(own_engine, messages, salt)
                assert usage["prompt_tokens_details"]["cached_tokens"] > 0, "every prefix warmed"

    lifecycle = [e for e in await events_by_time(kafka, topics.lifecycle) if isinstance(e, ReplicaEvent)]
    starts = [e for e in lifecycle if type(e).STATE == "starting"]
    assert len(starts) == 2, [type(e).STATE for e in lifecycle]
    assert type(lifecycle[-1]).STATE == "ready"
    plans = [e for e in await events_by_time(kafka, topics.plans) if isinstance(e, WarmPlanIssued)]
    assert [plan.trigger_event_id for plan in plans] == [start.event_id for start in starts]
    results = [e for e in await events_by_time(kafka, topics.warm_results) if isinstance(e, WarmFinished)]
    second_plan = [r for r in results if r.plan_id == plans[1].plan_id]
    assert len(second_plan) == 1, "applied once"
    assert second_plan[0].verified_hits == len(slow.payloads) and not second_plan[0].failures
    assert all(
        not r.verified_hits or r.plan_id == plans[1].plan_id for r in results if r.plan_id == plans[0].plan_id
    )
