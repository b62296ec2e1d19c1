"""What leaves the stores besides expiry: an epoch bump deletes the retired epoch's answers from Redis in the
background (they were unreachable at once), and only that tenant's model's; past its bound, L3 deletes the
query vectors soonest to expire."""

from __future__ import annotations

import uuid

import asyncpg
import redis.asyncio as aioredis

from tests.integration.result_cache_harness import MODEL, cache, chat, served
from warmplane.services.gateway.result_keys import Namespace, namespace_answers


async def keys_under(client: aioredis.Redis, prefix: str) -> list[bytes]:
    return [key async for key in client.scan_iter(match=prefix + "*")]


async def test_a_bump_purges_the_old_epochs_answers_and_no_one_elses(answers_redis: aioredis.Redis) -> None:
    tenant, neighbour = (f"t-{uuid.uuid4().hex[:8]}" for _ in range(2))
    pod, metrics = cache(answers_redis, None)
    for question in ("one?", "two?", "three?"):
        await served(pod, chat(question), tenant, 0, question)
        await served(pod, chat(question), neighbour, 0, question)
    await served(pod, chat("kept?"), tenant, 1, "kept")
    retired = namespace_answers(Namespace(tenant, MODEL, 0))
    assert len(await keys_under(answers_redis, retired)) == 3

    pod.epoch_bumped(tenant, MODEL, 1)
    await pod.drain(5)

    assert await keys_under(answers_redis, retired) == []
    assert len(await keys_under(answers_redis, namespace_answers(Namespace(tenant, MODEL, 1)))) == 1
    assert len(await keys_under(answers_redis, namespace_answers(Namespace(neighbour, MODEL, 0)))) == 3
    purged = metrics.registry.get_sample_value("warmplane_gateway_result_purged_total", {"model": MODEL})
    assert purged == 3


async def test_past_its_bound_l3_keeps_the_latest_to_expire(
    answers_redis: aioredis.Redis, pool: asyncpg.Pool
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    pod, _ = cache(answers_redis, pool, max_query_vectors=2, ttl_jitter=0)
    questions = ("Where is Lima?", "Where is Quito?", "Where is Bogota?", "Where is Caracas?")
    for question in questions:
        await served(pod, chat(question), tenant, 0, question)

    assert await pod.sweep() == 2

    kept = {row["answer_key"] for row in await pool.fetch("SELECT answer_key FROM result_queries")}
    found = [await pod.lookup(chat(question), tenant, 0, {}) for question in questions[2:]]
    assert kept == {lookup.key for lookup in found if lookup is not None}
