"""The result cache on its real stores: answers in Redis, query vectors in Postgres (pgvector).

Each test uses fresh tenants (the keys carry the tenant), so tests sharing the session's Redis and a
fresh database never see each other's answers.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import msgspec
import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from tests.integration.planner_harness import poll_until
from warmplane.services.gateway.metrics import GatewayMetrics
from warmplane.services.gateway.openai_request import ClientRequest, decode
from warmplane.services.gateway.result_cache import ResultCache
from warmplane.services.gateway.result_stores import PgQueryIndex, RedisAnswers, redis_client
from warmplane.services.gateway.settings import ResultCacheSettings
from warmplane.services.gateway.text_embedding import NgramEmbedder
from warmplane.shared.embedded import EmbeddedRedis
from warmplane.shared.embedded.processes import free_port
from warmplane.shared.settings import RedisSettings

MODEL = "tiny"
SYSTEM = "You answer questions about geography in one short sentence."


def chat(question: str, *, system: str = SYSTEM, **extra: Any) -> ClientRequest:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 8,
        **extra,
    }
    return decode(msgspec.json.encode(body), "chat")


def answer(text: str) -> bytes:
    return msgspec.json.encode({"choices": [{"message": {"role": "assistant", "content": text}}]})


@pytest.fixture
async def answers_redis(embedded_redis: EmbeddedRedis) -> AsyncIterator[aioredis.Redis]:
    client = redis_client(RedisSettings(url=SecretStr(embedded_redis.url)))
    yield client
    await client.aclose()


@pytest.fixture
async def pool(migrated_database: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    yield pool
    await pool.close()


def cache(
    client: aioredis.Redis, pool: asyncpg.Pool | None, **settings: Any
) -> tuple[ResultCache, GatewayMetrics]:
    metrics = GatewayMetrics(CollectorRegistry())
    options = ResultCacheSettings(enabled=True, semantic=pool is not None, lookup_timeout_s=2, **settings)
    index = None if pool is None else PgQueryIndex(pool)
    return ResultCache(options, RedisAnswers(client), index, NgramEmbedder(), metrics), metrics


def lookups(metrics: GatewayMetrics, tenant: str, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "warmplane_gateway_result_lookups_total", {"tenant": tenant, "model": MODEL, "outcome": outcome}
    )
    return value or 0.0


async def served(results: ResultCache, request: ClientRequest, tenant: str, epoch: int, text: str) -> None:
    """A miss answered by a (pretend) replica with `text`, kept; returns once it is stored."""
    found = await results.lookup(request, tenant, epoch, "")
    assert found is not None and found.hit is None
    results.keep(found, answer(text))
    await results.drain(5)


async def test_an_answer_is_given_again_only_in_its_tenant_and_epoch(
    answers_redis: aioredis.Redis, pool: asyncpg.Pool
) -> None:
    results, metrics = cache(answers_redis, pool)
    acme, globex = f"acme-{uuid.uuid4().hex[:6]}", f"globex-{uuid.uuid4().hex[:6]}"
    question = chat("What is the capital of France?")
    await served(results, question, acme, 3, "Paris.")

    again = await results.lookup(chat("What is the capital of France?", user="someone-else"), acme, 3, "")
    assert again is not None and again.hit is not None
    assert (again.hit.tier, again.hit.answer) == ("exact", answer("Paris."))
    assert not again.keep
    for tenant, epoch in ((globex, 3), (acme, 4), (acme, 2)):
        elsewhere = await results.lookup(question, tenant, epoch, "")
        assert elsewhere is not None and elsewhere.hit is None, (tenant, epoch)
    assert lookups(metrics, acme, "exact") == 1
    assert lookups(metrics, acme, "miss") == 3  # the first, and epochs 4 and 2


async def test_alike_queries_share_an_answer_only_under_the_same_context(
    answers_redis: aioredis.Redis, pool: asyncpg.Pool
) -> None:
    results, metrics = cache(answers_redis, pool, similarity=0.85)
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    await served(results, chat("What is the capital of France?"), tenant, 0, "Paris.")

    alike = await results.lookup(chat("what's the capital of france"), tenant, 0, "")
    assert alike is not None and alike.hit is not None
    assert alike.hit.tier == "semantic" and 0.85 <= alike.hit.similarity < 1
    assert alike.hit.answer == answer("Paris.")
    misses = [
        chat("What is the capital of Germany?"),  # alike in characters, not enough
        chat("what's the capital of france", system="Answer in French."),  # another context
        chat("what's the capital of france", max_tokens=64),  # another sampling setting
    ]
    for request in misses:
        found = await results.lookup(request, tenant, 0, "")
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
        assert await results.lookup(request, tenant, 0, control) is None, reason
        labels = {"tenant": tenant, "model": MODEL, "reason": reason}
        assert metrics.registry.get_sample_value("warmplane_gateway_result_bypass_total", labels) == 1

    refreshed = await results.lookup(chat("Name a river."), tenant, 0, "no-cache")
    assert refreshed is not None and refreshed.hit is None and refreshed.keep
    results.keep(refreshed, answer("The Loire."))
    await results.drain(5)
    found = await results.lookup(chat("Name a river."), tenant, 0, "")
    assert found is not None and found.hit is not None and found.hit.answer == answer("The Loire.")
    rows = "SELECT count(*) FROM result_queries WHERE tenant = $1"
    assert await pool.fetchval(rows, tenant) == 1  # the refreshed answer renewed its row


async def test_answers_expire_and_their_vectors_are_swept(
    answers_redis: aioredis.Redis, pool: asyncpg.Pool
) -> None:
    results, _ = cache(answers_redis, pool, ttl_s=0.3)
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    question = chat("What is the longest river in Europe?")
    await served(results, question, tenant, 0, "The Volga.")
    assert await pool.fetchval("SELECT count(*) FROM result_queries WHERE tenant = $1", tenant) == 1

    async def forgotten() -> bool:
        found = await results.lookup(question, tenant, 0, "")
        return found is not None and found.hit is None

    await poll_until(forgotten, timeout_s=10, what="the answer to expire")
    assert await results.sweep() >= 1
    assert await pool.fetchval("SELECT count(*) FROM result_queries WHERE tenant = $1", tenant) == 0


async def test_an_unreachable_store_is_a_miss_not_a_failure() -> None:
    dead = redis_client(RedisSettings(url=SecretStr(f"redis://127.0.0.1:{free_port()}/0")))
    results, metrics = cache(dead, None)
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    found = await results.lookup(chat("Name a mountain."), tenant, 0, "")
    assert found is not None and found.hit is None and found.keep
    assert lookups(metrics, tenant, "error") == 1
    results.keep(found, answer("Mont Blanc."))
    await results.drain(5)
    labels = {"model": MODEL, "outcome": "error"}
    assert metrics.registry.get_sample_value("warmplane_gateway_result_keeps_total", labels) == 1
    await dead.aclose()
