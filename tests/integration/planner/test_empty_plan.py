"""Knowing when not to warm, on real parts: a model whose traffic never repeats gets an empty plan that says
why, and its replica turns ready at once."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg

from tests.integration.planner_harness import MODEL, events_on, poll_until, produce, request
from tests.integration.warmer_harness import conversation, counted, ready_status, wait_for, warmer_settings
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.settings import PlannerSettings, PlanSettings
from warmplane.services.warmer.service import Warmer
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm
from warmplane.shared.events import PrefixPayload, RequestObserved, WarmPlanIssued
from warmplane.shared.topics import Topics

_TIMEOUT_S = 60.0
_CONVERSATIONS = 300


def never_repeating(rng: random.Random, now: datetime) -> list[RequestObserved]:
    """`_CONVERSATIONS` chats seen once each, one every 4 s up to `now`, each with its payload (so every
    one could be warmed): 20 minutes of history in which no prefix was ever used twice."""
    events = []
    for i in range(_CONVERSATIONS):
        root, leaf = rng.getrandbits(62), rng.getrandbits(62)
        payload = PrefixPayload(prefix_id=leaf, messages=conversation(rng, words_per_turn=20))
        at = now - timedelta(seconds=4 * (_CONVERSATIONS - i))
        events.append(request([root, leaf], at=at, payload=payload))
    return events


async def test_a_model_whose_traffic_never_repeats_gets_an_empty_plan_and_turns_ready_at_once(
    planner_settings: PlannerSettings, vllm_engine: EmbeddedVllm
) -> None:
    settings = planner_settings.model_copy(update={"plans": PlanSettings()})  # the planner's defaults
    kafka = settings.kafka
    traffic = never_repeating(random.Random(uuid.uuid4().int), datetime.now(UTC))
    await produce(kafka, traffic)
    dsn = settings.postgres.asyncpg_dsn()
    warmer = warmer_settings(kafka, [vllm_engine], node="node-a", secrets={"acme": uuid.uuid4().hex})
    async with running_planner(settings) as planner:
        await poll_until(lambda: counted(dsn, len(traffic)), timeout_s=_TIMEOUT_S, what="traffic counted")
        async with Warmer(warmer) as running:
            [driver] = running.drivers.values()
            await wait_for(lambda: driver.tracker.ready, timeout_s=_TIMEOUT_S, what="the replica ready")
            assert await ready_status(running.http_port) == 200
            assert not driver.tracker.partial, driver.tracker.reason
            assert driver.tracker.last_outcome is not None
            assert driver.tracker.last_outcome.fraction == 1.0
        assert planner.metrics.empty_plans.labels("nothing_likely")._value.get() == 1

    [plan] = await events_on(kafka, Topics(kafka.topic_prefix).plans, WarmPlanIssued)
    assert plan.items == []
    assert plan.empty_reason == (
        f"warming buys little for model {MODEL.name}: no prefix is at least 5% likely to be reused"
    )
    db = await asyncpg.connect(dsn)
    try:  # what the API reads (`pg_read.PLANS`)
        assert await db.fetchval("SELECT event->>'empty_reason' FROM warm_plans") == plan.empty_reason
    finally:
        await db.close()
