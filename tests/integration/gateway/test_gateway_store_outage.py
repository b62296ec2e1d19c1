"""The gateway's result-cache stores gone mid-traffic (issue 21's fault suite): PostgreSQL with pgvector,
then Redis too, stopped under a running gateway. Every request is still answered (from Redis while it
lasts, else by the engine), each lookup and keep that failed is counted, and once the stores are back the
cache serves again. The stores are servers of the test's own (the session's serve the other tests)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.integration.gateway_harness import (
    TIMEOUT,
    caching_gateway_settings,
    chat_body,
    engine_served,
    headers,
    metric_sample,
    vllm_requests,
)
from tests.real_parts import fresh_database
from warmplane.services.gateway.service import Gateway
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres, EmbeddedRedis
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedRedis, EmbeddedPostgres, str]]:
    """A Redis and a PostgreSQL (migrated database) this test may stop."""
    with EmbeddedRedis(tmp_path / "redis") as redis, EmbeddedPostgres(tmp_path / "postgres") as postgres:
        async with fresh_database(postgres) as dsn:
            yield redis, postgres, dsn


async def test_with_its_stores_gone_the_gateway_answers_from_the_engine_and_counts_it(
    embedded_kafka: EmbeddedKafka,
    vllm_engine: EmbeddedVllm,
    stores: tuple[EmbeddedRedis, EmbeddedPostgres, str],
) -> None:
    redis, postgres, dsn = stores
    # No L1: this test is about the shared stores, which L1 would answer for.
    settings, keys = caching_gateway_settings(
        embedded_kafka.bootstrap_servers, vllm_engine, redis.url, dsn, l1_max_entries=0
    )
    model = vllm_engine.model_name
    rng = random.Random(uuid.uuid4().int)
    body = chat_body(rng, model)
    acme = headers(keys["acme"])
    served = await vllm_requests(vllm_engine)
    async with (
        Gateway(settings) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=TIMEOUT) as client,
    ):
        assert gateway.parts is not None and gateway.parts.results is not None

        async def to_engine(asked: dict[str, object]) -> None:
            """`asked` is answered, by the engine, as a miss."""
            nonlocal served
            answered = await client.post("/v1/chat/completions", json=asked, headers=acme)
            assert answered.status_code == 200, answered.text
            assert answered.headers["x-warmplane-cache"] == "miss"
            served += 1
            await engine_served(vllm_engine, served)

        first = await client.post("/v1/chat/completions", json=body, headers=acme)
        assert (first.status_code, first.headers["x-warmplane-cache"]) == (200, "miss")
        await gateway.parts.results.drain(5)
        cached = await client.post("/v1/chat/completions", json=body, headers=acme)
        assert cached.headers["x-warmplane-cache"] == "exact"
        served += 1
        await engine_served(vllm_engine, served)

        # pgvector gone: exact answers still come from Redis; a new question's semantic lookup fails.
        await asyncio.to_thread(postgres.stop)
        still = await client.post("/v1/chat/completions", json=body, headers=acme)
        assert (still.status_code, still.headers["x-warmplane-cache"]) == (200, "exact")
        await to_engine(chat_body(rng, model))
        # Redis gone too: nothing to look up in.
        await asyncio.to_thread(redis.stop)
        await to_engine(body)
        await gateway.parts.results.drain(5)
        metrics = (await client.get(f"{gateway.metrics_url}/metrics")).text
        errors = {
            name: metric_sample(metrics, f"warmplane_gateway_result_{name}_total", outcome="error")
            for name in ("lookups", "keeps")
        }
        assert errors == {"lookups": 2, "keeps": 2}

        await asyncio.gather(asyncio.to_thread(redis.start), asyncio.to_thread(postgres.start))
        again = await client.post("/v1/chat/completions", json=body, headers=acme)  # Redis kept nothing
        assert (again.status_code, again.headers["x-warmplane-cache"]) == (200, "miss")
        await gateway.parts.results.drain(5)
        back = await client.post("/v1/chat/completions", json=body, headers=acme)
        assert back.headers["x-warmplane-cache"] == "exact", "the cache serves again"
