"""Bad input reaching a warmer on the real broker and engine: every case answered with a reason, nothing lost,
and the replica never ready on a warm that did not happen before its deadline."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

from tests.integration.planner_harness import MODEL, events_on, poll_until, produce, read_topic
from tests.integration.warmer_harness import (
    conversation,
    ready_status,
    status_code,
    wait_for,
    warmer_settings,
)
from warmplane.services.warmer.core.replica import Phase
from warmplane.services.warmer.service import Warmer
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.embedded.vllm_engine import MAX_MODEL_LEN, EmbeddedVllm
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import PrefixPayload, WarmFinished, WarmItem, WarmPlanIssued
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import DeadLetterHeaders, Topics

_TIMEOUT_S = 60.0


def warm_plan(replica: str, node: str, items: list[WarmItem], deadline: datetime) -> WarmPlanIssued:
    plan_id = new_event_id()
    return WarmPlanIssued(
        event_id=plan_id,
        occurred_at=datetime.now(UTC),
        producer="test",
        model=MODEL,
        plan_id=plan_id,
        replica=replica,
        node=node,
        epoch=0,
        items=items,
        budget_tokens=10_000,
        deadline=deadline,
    )


async def _results(kafka: KafkaSettings) -> list[WarmFinished]:
    return await events_on(kafka, Topics(kafka.topic_prefix).warm_results, WarmFinished)


async def test_bad_plans_are_answered_with_reasons_and_a_failed_item_keeps_the_replica_unready(
    embedded_kafka: EmbeddedKafka, vllm_engine: EmbeddedVllm
) -> None:
    kafka = KafkaSettings(
        bootstrap_servers=embedded_kafka.bootstrap_servers,
        topic_prefix=f"t{uuid.uuid4().hex[:8]}",
        session_timeout_ms=2_000,
        heartbeat_interval_ms=500,
    )
    topics = Topics(kafka.topic_prefix)
    settings = warmer_settings(kafka, [vllm_engine], node="node-f", secrets={"acme": uuid.uuid4().hex})
    rng = random.Random(uuid.uuid4().int)
    good = WarmItem(1, 300, PrefixPayload(1, messages=conversation(rng)), "acme")
    too_long = WarmItem(
        2, MAX_MODEL_LEN + 100, PrefixPayload(2, prompt=[300] * (MAX_MODEL_LEN + 100)), "acme"
    )
    unknown_tenant = WarmItem(3, 300, PrefixPayload(3, messages=conversation(rng)), "initech")
    async with Warmer(settings) as warmer:
        [driver] = warmer.drivers.values()
        await wait_for(lambda: driver.tracker.phase is Phase.LOADING, timeout_s=_TIMEOUT_S, what="loaded")
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        plan = warm_plan(driver.replica, "node-f", [good, too_long, unknown_tenant], deadline)
        ghost = warm_plan("ghost", "node-f", [good], deadline)
        elsewhere = warm_plan("other-r0", "other-node", [good], deadline)
        await produce(kafka, [(topics.plans, b"{not json"), elsewhere, ghost, plan, plan])

        await wait_for(lambda: driver.last_report is not None, timeout_s=_TIMEOUT_S, what="the plan run")
        assert datetime.now(UTC) < deadline  # so what follows shows the deadline policy, not a slow run
        assert not driver.tracker.ready and await ready_status(warmer.http_port) == 503
        await wait_for(lambda: driver.tracker.ready, timeout_s=_TIMEOUT_S, what="ready at the deadline")
        assert datetime.now(UTC) >= deadline
        assert driver.tracker.partial
        assert driver.tracker.reason == "deadline passed with 1 of 3 prefixes verified"
        assert await status_code(warmer.http_port, "/healthz") == 200  # bad input stopped no loop

        async def answered() -> bool:
            return len(await _results(kafka)) >= 2

        await poll_until(answered, timeout_s=_TIMEOUT_S, what="both plans answered")

    finished = await _results(kafka)
    by_plan = {result.plan_id: result for result in finished}
    assert set(by_plan) == {plan.plan_id, ghost.plan_id}  # the other node's plan is not this warmer's
    assert len(finished) == 2  # the plan that arrived twice ran once
    assert by_plan[ghost.plan_id].failures == [
        f"refused: unknown replica 'ghost' on node 'node-f' (drives ['{driver.replica}'])"
    ]
    outcome = by_plan[plan.plan_id]
    assert (outcome.verified_hits, outcome.items_done, outcome.partial) == (1, 3, True)
    rejected, unsalted = sorted(outcome.failures)
    assert rejected.startswith("prefix 2: POST /v1/completions: HTTP 400")
    assert unsalted == "prefix 3: no cache-salt secret for tenant 'initech'"

    [letter] = await read_topic(kafka, topics.dead_letter)
    headers = dict(letter.headers)
    assert letter.value == b"{not json"
    assert headers[DeadLetterHeaders.REASON].decode().startswith("not a JSON")
    assert headers[DeadLetterHeaders.CONSUMER] == b"warmer/node-f"
