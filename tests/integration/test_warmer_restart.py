"""A warmer restarted mid-plan (issue 21's fault suite), its engine still running: the new warmer announces
the replica as a new start, the planner plans that start, the warm is applied once and verified, and only
then is the replica ready. The first plan's run ended with its warmer; nothing of it is taken as done."""

from __future__ import annotations

import random
import uuid

from tests.integration.planner_harness import MODEL, poll_until, produce, running_planner
from tests.integration.test_warm_loop import _counted, _events
from tests.integration.warmer_harness import conversation_traffic, real_chat, wait_for, warmer_settings
from warmplane.services.planner.settings import PlannerSettings
from warmplane.services.warmer.core.replica import Phase
from warmplane.services.warmer.service import Warmer
from warmplane.services.warmer.settings import WarmSettings
from warmplane.shared.cache_salt import derive_cache_salt
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm
from warmplane.shared.events import ReplicaEvent, WarmFinished, WarmPlanIssued
from warmplane.shared.topics import Topics

_TIMEOUT_S = 60.0


async def test_a_warmer_restarted_mid_plan_warms_the_new_start_once_and_only_then_is_ready(
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
    settings = warmer_settings(kafka, [own_engine], node="node-r", secrets={"acme": secret}, warm=warm)
    async with running_planner(planner_settings):
        await poll_until(lambda: _counted(dsn, len(traffic)), timeout_s=_TIMEOUT_S, what="traffic")
        async with Warmer(settings) as first:
            [driver] = first.drivers.values()

            def warming_midway() -> bool:
                report = driver.progress()
                return driver.tracker.phase is Phase.WARMING and report is not None and report.items_done >= 3

            await wait_for(warming_midway, timeout_s=_TIMEOUT_S, what="the first warm under way")
            assert not driver.tracker.ready
            earlier = driver.tracker.incarnation
        # The first warmer is gone mid-plan; the engine runs on.
        async with Warmer(settings) as second:
            [driver] = second.drivers.values()
            await wait_for(lambda: driver.tracker.ready, timeout_s=_TIMEOUT_S, what="ready again")
            assert driver.tracker.incarnation != earlier and not driver.tracker.partial, driver.tracker.reason
            salt = derive_cache_salt(secret.encode(), "acme", MODEL.name, 0)
            for messages in payloads.values():
                usage = await real_chat(own_engine, messages, salt)
                assert usage["prompt_tokens_details"]["cached_tokens"] > 0, "every prefix warmed"

    lifecycle = [e for e in await _events(kafka, topics.lifecycle) if isinstance(e, ReplicaEvent)]
    starts = [e for e in lifecycle if type(e).STATE == "starting"]
    assert len(starts) == 2, [type(e).STATE for e in lifecycle]
    assert type(lifecycle[-1]).STATE == "ready"
    plans = [e for e in await _events(kafka, topics.plans) if isinstance(e, WarmPlanIssued)]
    assert [plan.trigger_event_id for plan in plans] == [start.event_id for start in starts]
    results = [e for e in await _events(kafka, topics.warm_results) if isinstance(e, WarmFinished)]
    second_plan = [r for r in results if r.plan_id == plans[1].plan_id]
    assert len(second_plan) == 1, "applied once"
    assert second_plan[0].verified_hits == len(payloads) and not second_plan[0].failures
    assert all(
        not r.verified_hits or r.plan_id == plans[1].plan_id for r in results if r.plan_id == plans[0].plan_id
    )
