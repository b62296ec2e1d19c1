"""Warming L1 from the fleet's record of asks, on real Redis: a pod that starts holds the most asked answers
of each (tenant, model)'s current epoch before it serves, and a bump brings in what others kept since.

Each test uses a fresh tenant and warms only its (tenant, model), since the record is shared by the
session's Redis."""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis

from tests.integration.result_cache_harness import MODEL, cache, chat, lookups, served
from warmplane.services.gateway.result_cache import ResultCache


async def asked(results: ResultCache, tenant: str, epoch: int, question: str, times: int) -> None:
    for _ in range(times):
        found = await results.lookup(chat(question), tenant, epoch, {})
        assert found is not None and found.hit is not None


async def test_a_starting_pod_holds_the_most_asked_answers_of_the_current_epoch(
    answers_redis: aioredis.Redis,
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    first, _ = cache(answers_redis, None, hot=True)
    for epoch in (0, 1):
        for question in ("often?", "sometimes?", "once?"):
            await served(first, chat(question), tenant, epoch, f"{question} in epoch {epoch}")
    await asked(first, tenant, 1, "often?", 5)
    await asked(first, tenant, 1, "sometimes?", 3)
    await asked(first, tenant, 0, "once?", 9)  # the old epoch's asks count for nothing now
    assert await first.flush_asks() > 0

    starting, metrics = cache(answers_redis, None, hot=True, warm_entries=2)
    held = await starting.warm(lambda _tenant, _model: 1, only=(tenant, MODEL))

    assert held == 2
    for question in ("often?", "sometimes?"):
        found = await starting.lookup(chat(question), tenant, 1, {})
        assert found is not None and found.hit is not None and found.hit.tier == "l1"
    assert lookups(metrics, tenant, "l1") == 2
    found = await starting.lookup(chat("once?"), tenant, 1, {})  # not among the two: from Redis
    assert found is not None and found.hit is not None and found.hit.tier == "exact"
    other = await starting.lookup(chat("often?"), f"{tenant}-other", 1, {})
    assert other is not None and other.hit is None  # held answers stay their tenant's
    assert metrics.registry.get_sample_value("warmplane_gateway_result_warmed_total", {"model": MODEL}) == 2


async def test_after_a_bump_a_pod_holds_what_others_kept_under_the_new_epoch(
    answers_redis: aioredis.Redis,
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    pod, _ = cache(answers_redis, None, hot=True)
    other, _ = cache(answers_redis, None, hot=True)
    await served(pod, chat("old?"), tenant, 0, "old answer")
    await served(other, chat("new?"), tenant, 1, "new answer")
    await asked(other, tenant, 1, "new?", 2)
    await other.flush_asks()

    pod.epoch_bumped(tenant, MODEL, 1)
    await pod.drain(5)

    found = await pod.lookup(chat("new?"), tenant, 1, {})
    assert found is not None and found.hit is not None and found.hit.tier == "l1"


async def test_warming_off_records_nothing_and_holds_nothing(answers_redis: aioredis.Redis) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    pod, _ = cache(answers_redis, None, hot=True, warm_entries=0)
    await served(pod, chat("asked?"), tenant, 0, "answer")
    await asked(pod, tenant, 0, "asked?", 3)
    assert await pod.flush_asks() == 0
    assert await pod.warm(lambda _tenant, _model: 0, only=(tenant, MODEL)) == 0
