"""The loop end to end on real parts: request events -> planner -> plan -> warmer -> vLLM -> ready.

Conversations are random words from a generator seeded afresh per test and salts come from a fresh
secret, so tests sharing the session's engine never find each other's blocks. Expectations come from the
measured rule (NOTES-parts): a real request whose prompt starts with a warmed rendering of `t` tokens finds
`32 * (t // 32)` of them cached.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime

import asyncpg

from tests.integration.planner_harness import MODEL, poll_until, produce, read_topic, running_planner
from tests.integration.warmer_harness import (
    conversation,
    conversation_traffic,
    ready_status,
    real_chat,
    wait_for,
    warmer_settings,
)
from warmplane.services.planner.settings import PlannerSettings
from warmplane.services.warmer.core.replica import Phase
from warmplane.services.warmer.service import Warmer
from warmplane.services.warmer.settings import WarmSettings
from warmplane.services.warmer.vllm_client import VllmEngineClient
from warmplane.shared.cache_salt import derive_cache_salt
from warmplane.shared.codec import EventCodec
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, EmbeddedVllm
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    EpochBumped,
    Event,
    PrefixPayload,
    ReplicaEvent,
    WarmFinished,
    WarmPlanIssued,
)
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics

_TIMEOUT_S = 60.0


async def _events(kafka: KafkaSettings, topic: str) -> list[Event]:
    codec = EventCodec(kafka.max_event_bytes)
    decoded = [codec.decode(record.value) for record in await read_topic(kafka, topic)]
    events = [event for event in decoded if isinstance(event, Event)]
    return sorted(events, key=lambda event: event.occurred_at)


async def _counted(dsn: str, expected: int) -> bool:
    db = await asyncpg.connect(dsn)
    try:
        total = await db.fetchval("SELECT coalesce(sum(requests), 0) FROM prefix_stats")
    finally:
        await db.close()
    return bool(total == expected)


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


async def _full_blocks(engine: EmbeddedVllm, messages: list[dict[str, str]]) -> int:
    """Tokens in the whole blocks of the warm rendering of `messages` (what a real request reuses)."""
    async with VllmEngineClient(
        engine.base_url, engine.model_name, connect_timeout_s=5, request_timeout_s=30
    ) as client:
        tokens = await client.tokenize(PrefixPayload(prefix_id=0, messages=messages))
    return BLOCK_SIZE * (len(tokens) // BLOCK_SIZE)


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
        await poll_until(lambda: _counted(dsn, len(traffic)), timeout_s=_TIMEOUT_S, what="traffic counted")
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
                expected = await _full_blocks(vllm_engine, messages)
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
                assert usage["prompt_tokens_details"]["cached_tokens"] == await _full_blocks(
                    vllm_engine, messages
                )
        # The planner recorded both plans' outcomes from the warmer's results, and the epoch.
        await poll_until(
            lambda: _plan_states(dsn, ["verified", "verified"]), timeout_s=_TIMEOUT_S, what="outcomes"
        )
        assert await _fetch(dsn, "SELECT tenant, model, epoch FROM epochs") == [("acme", MODEL.name, 1)]

    plan, replan = [e for e in await _events(kafka, topics.plans) if isinstance(e, WarmPlanIssued)]
    assert {item.prefix_id for item in plan.items} == set(payloads)
    assert {(item.epoch, item.tenant) for item in plan.items} == {(0, "acme")}
    assert {(item.epoch, item.prefix_id) for item in replan.items} == {(1, prefix) for prefix in payloads}
    lifecycle = [e for e in await _events(kafka, topics.lifecycle) if isinstance(e, ReplicaEvent)]
    assert [type(e).STATE for e in lifecycle] == ["starting", "loading", "warming", "ready"]
    assert (plan.trigger_event_id, replan.trigger_event_id) == (lifecycle[0].event_id, None)
    # From the weights loaded on, the lifecycle says how many tokens the engine's prefix cache holds.
    assert lifecycle[0].kv_capacity_tokens is None
    capacity = lifecycle[1].kv_capacity_tokens
    assert capacity is not None and capacity > 0 and capacity % BLOCK_SIZE == 0
    finished = [e for e in await _events(kafka, topics.warm_results) if isinstance(e, WarmFinished)]
    assert [(f.plan_id, f.verified_hits, f.failures) for f in finished] == [
        (plan.plan_id, 4, []),
        (replan.plan_id, 4, []),
    ]
    assert finished[0].tokens_prefilled > 4 * 4 * BLOCK_SIZE


async def test_an_engine_killed_mid_warm_is_never_ready_and_is_rewarmed_when_it_returns(
    planner_settings: PlannerSettings, own_engine: EmbeddedVllm
) -> None:
    rng = random.Random(uuid.uuid4().int)
    secret = uuid.uuid4().hex
    kafka = planner_settings.kafka
    topics = Topics(kafka.topic_prefix)
    traffic, payloads = conversation_traffic(rng, 40, repeats=2)
    await produce(kafka, traffic)
    dsn = planner_settings.postgres.asyncpg_dsn()
    warm = WarmSettings(concurrency=1, health_interval_s=0.2, progress_interval_s=0.2, request_timeout_s=10)
    settings = warmer_settings(kafka, [own_engine], node="node-k", secrets={"acme": secret}, warm=warm)
    async with running_planner(planner_settings):
        await poll_until(lambda: _counted(dsn, len(traffic)), timeout_s=_TIMEOUT_S, what="traffic")
        async with Warmer(settings) as warmer:
            [driver] = warmer.drivers.values()
            tracker = driver.tracker
            first = tracker.incarnation

            def warming_midway() -> bool:
                report = driver.progress()
                return tracker.phase is Phase.WARMING and report is not None and report.items_done >= 3

            await wait_for(warming_midway, timeout_s=_TIMEOUT_S, what="the warm under way")
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
            salt = derive_cache_salt(secret.encode(), "acme", MODEL.name, 0)
            messages = next(iter(payloads.values()))
            usage = await real_chat(own_engine, messages, salt)
            expected = await _full_blocks(own_engine, messages)
            assert usage["prompt_tokens_details"]["cached_tokens"] == expected

    lifecycle = [e for e in await _events(kafka, topics.lifecycle) if isinstance(e, ReplicaEvent)]
    states = [type(e).STATE for e in lifecycle]
    assert states == ["starting", "loading", "warming", "failed", "starting", "loading", "warming", "ready"]
    plans = [e for e in await _events(kafka, topics.plans) if isinstance(e, WarmPlanIssued)]
    assert [plan.trigger_event_id for plan in plans] == [lifecycle[0].event_id, lifecycle[4].event_id]
    results = [e for e in await _events(kafka, topics.warm_results) if isinstance(e, WarmFinished)]
    by_plan = {result.plan_id: result for result in results}
    assert by_plan[plans[0].plan_id].partial and by_plan[plans[0].plan_id].failures
    assert by_plan[plans[1].plan_id].verified_hits == len(payloads)
