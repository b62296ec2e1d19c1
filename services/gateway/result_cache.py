"""The versioned result cache: an answer given once is given again, without a replica, until the
(tenant, model) epoch moves or the answer's time to live runs out.

Contracts:
- Only requests `result_keys.bypass_reason` lets through are looked up or kept; the rest are counted
  by reason and never touch the stores.
- An answer is shared only inside its namespace (tenant, model, epoch): the tenant and epoch are part
  of every key, so no tenant reads another's answers and an epoch bump (new weights, new prompt
  revision, or by hand) retires every answer of the old one at once.
- Exact tier first (the canonical request's key, in Redis); then, if enabled, the semantic tier: the
  nearest earlier query of the same context at least `similarity` alike (Postgres, pgvector), whose
  answer must still be in Redis.
- The cache never fails a request: a lookup that errs or takes longer than `lookup_timeout_s` is a
  miss (counted as `error`); an embedding that fails or takes longer than `embedding_timeout_s` skips
  the semantic tier for that request (counted by reason); answers are kept in the background, at most
  `max_pending_keeps` at a time, never awaited by the request that produced them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from typing import Literal

import asyncpg
import redis

from warmplane.services.gateway.metrics import GatewayMetrics
from warmplane.services.gateway.openai_request import ClientRequest
from warmplane.services.gateway.result_keys import CacheQuery, bypass_reason, cache_query, directive
from warmplane.services.gateway.result_stores import AnswerStore, Namespace, QueryIndex, QueryScope
from warmplane.services.gateway.settings import ResultCacheSettings
from warmplane.services.gateway.text_embedding import Embedder
from warmplane.shared.redis_keys import RESULT_ANSWERS

log = logging.getLogger(__name__)
Tier = Literal["exact", "semantic"]
_STORE_ERRORS = (redis.RedisError, OSError, asyncpg.PostgresError, TimeoutError)


@dataclass(frozen=True, slots=True)
class Hit:
    answer: bytes
    tier: Tier
    similarity: float


@dataclass(slots=True)
class Lookup:
    """One request's dealings with the cache: its keys, what the lookup found, whether to keep."""

    namespace: Namespace
    query: CacheQuery
    key: str
    keep: bool
    hit: Hit | None = None
    vector: list[float] | None = None


class ResultCache:
    """`index` is None when the semantic tier is off."""

    def __init__(
        self,
        settings: ResultCacheSettings,
        answers: AnswerStore,
        index: QueryIndex | None,
        embedder: Embedder,
        metrics: GatewayMetrics,
    ) -> None:
        self._settings = settings
        self._answers = answers
        self._index = index if settings.semantic else None
        self._embedder = embedder
        self._metrics = metrics
        self._pending: set[asyncio.Task[None]] = set()
        self._failing = False  # logged once when the stores start failing, once when they recover

    async def lookup(
        self, request: ClientRequest, tenant: str, epoch: int, cache_control: str
    ) -> Lookup | None:
        """The request's `Lookup` (with its `hit`, if any), or None when the cache must stay out of it."""
        wanted = directive(cache_control)
        reason = bypass_reason(request, wanted)
        if reason is not None:
            self._metrics.result_bypass.labels(tenant, request.model, reason).inc()
            return None
        namespace = Namespace(tenant, request.model, epoch)
        query = cache_query(request)
        found = Lookup(namespace, query, answer_key(namespace, query.exact), keep=True)
        if not wanted.lookup:
            self._metrics.result_bypass.labels(tenant, request.model, "no_cache").inc()
            return found
        outcome = "miss"
        try:
            async with asyncio.timeout(self._settings.lookup_timeout_s):
                found.hit = await self._find(found)
        except _STORE_ERRORS as exc:
            outcome = "error"
            self._note_failure(exc)
        else:
            self._note_success()
        if found.hit is not None:
            outcome = found.hit.tier
            found.keep = False
        self._metrics.result_lookups.labels(tenant, request.model, outcome).inc()
        return found

    async def _find(self, found: Lookup) -> Hit | None:
        answer = await self._answers.get(found.key)
        if answer is not None:
            return Hit(answer, "exact", 1.0)
        vector = await self._vector(found)
        if self._index is None or vector is None:
            return None
        nearest = await self._index.nearest(self._scope(found), vector)
        if nearest is None or nearest[1] < self._settings.similarity:
            return None
        answer = await self._answers.get(nearest[0])
        return None if answer is None else Hit(answer, "semantic", nearest[1])

    async def _vector(self, found: Lookup) -> list[float] | None:
        """The query's embedding (computed once), or None when the semantic tier does not apply."""
        text = found.query.text
        if (
            found.vector is None
            and self._index is not None
            and text
            and len(text) <= self._settings.max_query_chars
        ):
            try:
                async with asyncio.timeout(self._settings.embedding_timeout_s):
                    vector = await self._embedder.embed(text)
            except Exception as exc:  # whatever the model or its worker raises: this query skips the tier
                reason = "timeout" if isinstance(exc, TimeoutError) else "error"
                self._metrics.result_embedding_failures.labels(found.namespace.model, reason).inc()
                return None
            found.vector = vector if any(vector) else None
        return found.vector

    def _scope(self, found: Lookup) -> QueryScope:
        return QueryScope(found.namespace, self._embedder.name, found.query.context)

    def keep(self, found: Lookup, answer: bytes) -> None:
        """Keep a replica's 200 answer for `found`'s request, in the background."""
        model = found.namespace.model
        if not found.keep:
            return
        if len(answer) > self._settings.max_answer_bytes:
            self._metrics.result_keeps.labels(model, "too_large").inc()
            return
        if len(self._pending) >= self._settings.max_pending_keeps:
            self._metrics.result_keeps.labels(model, "dropped").inc()
            return
        task = asyncio.get_running_loop().create_task(self._keep(found, answer))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _keep(self, found: Lookup, answer: bytes) -> None:
        ttl_s = self._settings.ttl_s
        model = found.namespace.model
        try:
            await self._answers.put(found.key, answer, ttl_s)
            vector = await self._vector(found)
            if self._index is not None and vector is not None:
                await self._index.add(self._scope(found), vector, found.key, ttl_s)
        except _STORE_ERRORS as exc:
            self._metrics.result_keeps.labels(model, "error").inc()
            self._note_failure(exc)
            return
        self._metrics.result_keeps.labels(model, "kept").inc()

    def _note_failure(self, exc: BaseException) -> None:
        if not self._failing:
            self._failing = True
            log.warning(
                "the result cache's stores are failing (%s): requests go to replicas", type(exc).__name__
            )

    def _note_success(self) -> None:
        if self._failing:
            self._failing = False
            log.info("the result cache's stores answer again")

    async def sweep(self, limit: int = 10_000) -> int:
        """Delete expired query vectors (Redis expires answers by itself); how many were deleted."""
        return 0 if self._index is None else await self._index.sweep(limit)

    async def drain(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the answers still being kept."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)


def answer_key(namespace: Namespace, exact: str) -> str:
    """The Redis key of an answer: unambiguous whatever characters a tenant or model name holds."""
    material = "\0".join((namespace.tenant, namespace.model, str(namespace.epoch), exact))
    return RESULT_ANSWERS + hashlib.sha256(material.encode()).hexdigest()
