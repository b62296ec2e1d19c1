"""The result cache's stores for the tests beside this file: a client of the session's Redis, a pool on a
fresh migrated database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr

from warmplane.services.gateway.result_stores import redis_client
from warmplane.shared.embedded import EmbeddedRedis
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
