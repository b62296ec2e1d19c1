"""The result cache on its real stores: answers in Redis, query vectors in Postgres (pgvector).

Each test uses fresh tenants (the keys carry the tenant), so tests sharing the session's Redis and a
fresh database never see each other's answers.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import redis.asyncio as aioredis
from pydantic import SecretStr

from tests.integration.planner_harness import poll_until
from tests.integration.result_cache_harness import MODEL, answer, cache, chat, lookups, served
from warmplane.services.gateway.answer_record import pack
from warmplane.services.gateway.result_keys import Namespace, cache_query
from warmplane.services.gateway.result_lookup import answer_key
from warmplane.services.gateway.result_stores import redis_client
from warmplane.services.gateway.tenants import EpochBook
from warmplane.shared.embedded.processes import free_port
from warmplane.shared.settings import RedisSettings


async def test_an_answer_is_given_again_only_in_its_tenant_and_epoch(
    answers_redis: aioredis.Redis, pool: asyncpg.Pool
) -> None:
    results, metrics = cache(answers_redis, pool)
    acme, globex = f"acme-{uuid.uuid4().hex[:6]}", f"globex-{uuid.uuid4().hex[:6]}"
    question = chat("What is the capital of France?")
    await served(results, question, acme, 3, "Paris.")

    again = await results.lookup(chat("What is the capital of France?", user="someone-else"), acme, 3, {})
    assert again is not None and again.hit is not None
    assert (again.hit.tier, again.hit.answer) == ("l1", answer("Paris."))
    assert not again.keep
    other_pod, _ = cache(answers_redis, pool)
    for results_of, tenant, epoch in ((results, globex, 3), (results, acme, 4), (other_pod, acme, 2)):
        elsewhere = await results_of.lookup(question, tenant, epoch, {})
        assert elsewhere is not None and elsewhere.hit is None, (tenant, epoch)
        results_of.abandon(elsewhere)
    assert lookups(metrics, acme, "l1") == 1
    assert lookups(metrics, acme, "miss") == 2  # the first, and epoch 4


async def test_alike_queries_share_an_answer_only_under_the_same_context(
    answers_redis: aioredis.Redis, pool: asyncpg.Pool
) -> None:
    results, metrics = cache(answers_redis, pool, similarity=0.85)
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    await served(results, chat("What is the capital of France?"), tenant, 0, "Paris.")

    alike = await results.lookup(chat("what's the capital of france"), tenant, 0, {})
    assert alike is not None and alike.hit is not None
    assert alike.hit.tier == "semantic" and 0.85 <= alike.hit.similarity < 1
    assert alike.hit.answer == answer("Paris.")
    misses = [
        chat("What is the capital of Germany?"),  # alike in characters, not enough
        chat("what's the capital of france", system="Answer in French."),  # another context
        chat("what's the capital of france", max_tokens=64),  # another sampling setting
    ]
    for request in misses:
        found = await results.lookup(request, tenant, 0, {})
        assert found is not None and found.hit is None, request.body
    assert lookups(metrics, tenant, "semantic") == 1
    assert lookups(metrics, tenant, "miss") == 1 + len(misses)


async def test_requests_the_engine_would_answer_differently_stay_out(
    answers_redis: aioredis.Redis, pool: asyncpg.Pool
) -> None:
    results, metrics = cache(answers_redis, pool)
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    await served(results, chat("Name a river."), tenant, 0, "The Seine.")
    stays_out = {
        "sampling": (chat("Name a river.", temperature=0.7), ""),
        "choices": (chat("Name a river.", n=2), ""),
        "streaming": (chat("Name a river.", stream=True), ""),
        "no_store": (chat("Name a river."), "no-store"),
    }
    for reason, (request, control) in stays_out.items():
        assert await results.lookup(request, tenant, 0, {"cache-control": control}) is None, reason
        labels = {"tenant": tenant, "model": MODEL, "reason": reason}
        assert metrics.registry.get_sample_value("warmplane_gateway_result_bypass_total", labels) == 1

    refreshed = await results.lookup(chat("Name a river."), tenant, 0, {"cache-control": "no-cache"})
    assert refreshed is not None and refreshed.hit is None and refreshed.keep
    results.keep(refreshed, answer("The Loire."))
    await results.drain(5)
    found = await results.lookup(chat("Name a river."), tenant, 0, {})
    assert found is not None and found.hit is not None and found.hit.answer == answer("The Loire.")
    rows = "SELECT count(*) FROM result_queries WHERE tenant = $1"
    assert await pool.fetchval(rows, tenant) == 1  # the refreshed answer renewed its row


async def test_a_sampled_request_that_opts_in_is_answered_from_its_own_sampled_answers_only(
    answers_redis: aioredis.Redis, pool: asyncpg.Pool
) -> None:
    results, metrics = cache(answers_redis, pool)
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    allow = {"x-warmplane-cache": "allow-sampled"}
    await served(results, chat("Name a desert."), tenant, 0, "The Sahara.")
    sampled = chat("Name a desert.", temperature=0.9, seed=4)
    await served(results, sampled, tenant, 0, "The Gobi, this time.", headers=allow)
    found = await results.lookup(sampled, tenant, 0, allow)
    assert found is not None and found.hit is not None and found.hit.answer == answer("The Gobi, this time.")
    stream = await results.lookup(
        chat("Name a desert.", temperature=0.9, seed=4, stream=True), tenant, 0, allow
    )
    assert stream is None, "a stream is never answered from the cache, opted in or not"
    assert await results.lookup(sampled, tenant, 0, {}) is None, "not opted in"
    for reason in ("streaming", "sampling"):
        labels = {"tenant": tenant, "model": MODEL, "reason": reason}
        assert metrics.registry.get_sample_value("warmplane_gateway_result_bypass_total", labels) == 1


async def test_answers_expire_and_their_vectors_are_swept(
    answers_redis: aioredis.Redis, pool: asyncpg.Pool
) -> None:
    results, _ = cache(answers_redis, pool, ttl_s=0.3)
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    question = chat("What is the longest river in Europe?")
    await served(results, question, tenant, 0, "The Volga.")
    assert await pool.fetchval("SELECT count(*) FROM result_queries WHERE tenant = $1", tenant) == 1

    async def forgotten() -> bool:
        found = await results.lookup(question, tenant, 0, {})
        return found is not None and found.hit is None

    await poll_until(forgotten, timeout_s=10, what="the answer to expire")
    assert await results.sweep() >= 1
    assert await pool.fetchval("SELECT count(*) FROM result_queries WHERE tenant = $1", tenant) == 0


async def test_an_unreachable_store_is_a_miss_not_a_failure() -> None:
    dead = redis_client(RedisSettings(url=SecretStr(f"redis://127.0.0.1:{free_port()}/0")))
    results, metrics = cache(dead, None)
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    found = await results.lookup(chat("Name a mountain."), tenant, 0, {})
    assert found is not None and found.hit is None and found.keep
    assert lookups(metrics, tenant, "error") == 1
    results.keep(found, answer("Mont Blanc."))
    await results.drain(5)
    labels = {"model": MODEL, "outcome": "error"}
    assert metrics.registry.get_sample_value("warmplane_gateway_result_keeps_total", labels) == 1
    await dead.aclose()


async def test_an_answer_is_found_at_each_layer_and_fills_the_first(
    answers_redis: aioredis.Redis, pool: asyncpg.Pool
) -> None:
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    question = chat("What is the capital of Italy?")
    pod_a, metrics_a = cache(answers_redis, pool, ttl_s=100, similarity=0.85)
    await served(pod_a, question, tenant, 0, "Rome.")
    pod_b, metrics_b = cache(answers_redis, pool)
    pod_c, metrics_c = cache(answers_redis, pool, similarity=0.85)

    tiers = []
    paraphrase = chat("what's the capital of italy")
    for pod, request in ((pod_a, question), (pod_b, question), (pod_b, question), (pod_c, paraphrase)):
        found = await pod.lookup(request, tenant, 0, {})
        assert found is not None and found.hit is not None and found.hit.answer == answer("Rome.")
        tiers.append(found.hit.tier)
    assert tiers == ["l1", "exact", "l1", "semantic"]
    assert [lookups(m, tenant, "miss") for m in (metrics_a, metrics_b, metrics_c)] == [1, 0, 0]
    # Kept with jitter: within 10% of `ttl_s` either way, in Redis and in Postgres alike.
    key = answer_key(Namespace(tenant, MODEL, 0), cache_query(question).exact)
    assert 90_000 - 5_000 <= await answers_redis.pttl(key) <= 110_000
    left = "SELECT extract(epoch FROM expires_at - now()) FROM result_queries WHERE tenant = $1"
    assert 85 <= float(await pool.fetchval(left, tenant)) <= 110


async def test_scoped_by_user_an_end_user_never_reads_another_users_answer(
    answers_redis: aioredis.Redis, pool: asyncpg.Pool
) -> None:
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    scoped, metrics = cache(answers_redis, pool, scope_by_user=True, similarity=0.85)
    await served(scoped, chat("Name a lake.", user="ann"), tenant, 0, "Lake Geneva, for Ann.")
    other_pod, _ = cache(answers_redis, pool, scope_by_user=True, similarity=0.85)
    bobs = ((scoped, chat("Name a lake.", user="bob")), (other_pod, chat("name a lake", user="bob")))
    for pod, asked in bobs:
        found = await pod.lookup(asked, tenant, 0, {})
        assert found is not None and found.hit is None, "Bob misses Ann's answer in every layer"
        pod.abandon(found)
    again = await other_pod.lookup(chat("Name a lake.", user="ann"), tenant, 0, {})
    assert again is not None and again.hit is not None and again.hit.tier == "exact"
    assert await scoped.lookup(chat("Name a lake."), tenant, 0, {}) is None, "no user named: not cached"
    labels = {"tenant": tenant, "model": MODEL, "reason": "no_user"}
    assert metrics.registry.get_sample_value("warmplane_gateway_result_bypass_total", labels) == 1

    by_header, _ = cache(answers_redis, pool, scope_by_user=True, user_header="X-End-User")
    await served(by_header, chat("Name a sea."), tenant, 0, "The North Sea.", headers={"x-end-user": "ann"})
    bob = await by_header.lookup(chat("Name a sea."), tenant, 0, {"x-end-user": "bob"})
    assert bob is not None and bob.hit is None

    shared, _ = cache(answers_redis, pool)  # the default: a tenant's users share answers
    await served(shared, chat("Name a bay.", user="ann"), tenant, 0, "Biscay.")
    found = await shared.lookup(chat("Name a bay.", user="bob"), tenant, 0, {})
    assert found is not None and found.hit is not None


async def test_an_epoch_bump_drops_l1_at_once_and_the_next_sweep_deletes_its_vectors(
    answers_redis: aioredis.Redis, pool: asyncpg.Pool
) -> None:
    acme, globex = f"acme-{uuid.uuid4().hex[:6]}", f"globex-{uuid.uuid4().hex[:6]}"
    results, _ = cache(answers_redis, pool)
    epochs = EpochBook()
    epochs.watch(results.epoch_bumped)
    question = chat("What is the highest mountain in Africa?")
    for tenant, epoch in ((acme, 0), (acme, 1), (globex, 0)):
        await served(results, question, tenant, epoch, "Kilimanjaro.")
    rows = "SELECT tenant, epoch FROM result_queries WHERE tenant = ANY($1::text[]) ORDER BY tenant, epoch"
    assert len(await pool.fetch(rows, [acme, globex])) == 3

    epochs.bump(acme, MODEL, 2)
    async with asyncio.timeout(5):  # the bump brings the sweep forward: no waiting out `sweep_s`
        await results.next_sweep(3600)
    assert await results.sweep() >= 2
    assert [tuple(row) for row in await pool.fetch(rows, [acme, globex])] == [(globex, 0)]
    await results.drain(5)
    old = await results.lookup(question, acme, 1, {})
    assert old is not None and old.hit is None, "dropped from L1 on the bump, and purged from Redis"
    kept = await results.lookup(question, globex, 0, {})
    assert kept is not None and kept.hit is not None and kept.hit.tier == "l1"


async def test_a_stored_answer_that_is_not_intact_is_deleted_and_never_served(
    answers_redis: aioredis.Redis, pool: asyncpg.Pool
) -> None:
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    results, metrics = cache(answers_redis, pool)
    damaged = {
        "What is the capital of Spain?": answer("Madrid."),  # bare, as the v1 format held it
        "What is the capital of Peru?": pack(answer("Lima."))[:-3],  # cut short
    }
    for question, stored in damaged.items():
        key = answer_key(Namespace(tenant, MODEL, 0), cache_query(chat(question)).exact)
        await answers_redis.set(key, stored)
        found = await results.lookup(chat(question), tenant, 0, {})
        assert found is not None and found.hit is None, question
        assert not await answers_redis.exists(key)
        results.abandon(found)
    labels = {"model": MODEL}
    assert metrics.registry.get_sample_value("warmplane_gateway_result_corrupt_total", labels) == 2
    assert lookups(metrics, tenant, "miss") == 2
