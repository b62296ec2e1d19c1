"""Requests, answers and caches for the result cache's tests on its real stores (`gateway/conftest.py`
holds the stores' fixtures)."""

from __future__ import annotations

from typing import Any

import asyncpg
import msgspec
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from warmplane.services.gateway.metrics import GatewayMetrics
from warmplane.services.gateway.openai_request import ClientRequest, decode
from warmplane.services.gateway.result_cache import ResultCache
from warmplane.services.gateway.result_stores import PgQueryIndex, RedisAnswers
from warmplane.services.gateway.result_warming import HotPrompts
from warmplane.services.gateway.settings import ResultCacheSettings
from warmplane.services.gateway.text_embedding import Embedder, NgramEmbedder

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


def cache(
    client: aioredis.Redis,
    pool: asyncpg.Pool | None,
    *,
    hot: bool = False,
    embedder: Embedder | None = None,
    **settings: Any,
) -> tuple[ResultCache, GatewayMetrics]:
    """A result cache (a pod's) on `client` and, when given, `pool`; with its own metrics; with `hot`,
    recording asks for warming; embedding with `embedder` (default: trigrams)."""
    metrics = GatewayMetrics(CollectorRegistry())
    options = ResultCacheSettings(enabled=True, semantic=pool is not None, lookup_timeout_s=2, **settings)
    index = None if pool is None else PgQueryIndex(pool)
    record = HotPrompts(client) if hot else None
    space = embedder if embedder is not None else NgramEmbedder()
    results = ResultCache(options, RedisAnswers(client), index, space, metrics, hot=record)
    return results, metrics


def lookups(metrics: GatewayMetrics, tenant: str, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "warmplane_gateway_result_lookups_total", {"tenant": tenant, "model": MODEL, "outcome": outcome}
    )
    return value or 0.0


async def served(
    results: ResultCache,
    request: ClientRequest,
    tenant: str,
    epoch: int,
    text: str,
    *,
    headers: dict[str, str] | None = None,
) -> None:
    """A miss answered by a (pretend) replica with `text`, kept; returns once it is stored."""
    found = await results.lookup(request, tenant, epoch, headers or {})
    assert found is not None and found.hit is None and found.leads
    results.keep(found, answer(text))
    await results.drain(5)
