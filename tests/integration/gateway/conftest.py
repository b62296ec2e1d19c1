"""The result cache's parts for the tests beside this file: a client of the session's Redis, a pool on a
fresh migrated database, and the settings of a caching gateway in front of the session's engine."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr

from tests.integration.gateway_harness import caching_gateway_settings
from warmplane.services.gateway.result_stores import redis_client
from warmplane.services.gateway.settings import GatewaySettings
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedRedis
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm
from warmplane.shared.settings import RedisSettings


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


@pytest.fixture
def caching_gateway(
    embedded_kafka: EmbeddedKafka,
    embedded_redis: EmbeddedRedis,
    migrated_database: str,
    vllm_engine: EmbeddedVllm,
) -> tuple[GatewaySettings, dict[str, str]]:
    """`caching_gateway_settings` on the session's broker, Redis and engine and a fresh database."""
    return caching_gateway_settings(
        embedded_kafka.bootstrap_servers, vllm_engine, embedded_redis.url, migrated_database
    )
