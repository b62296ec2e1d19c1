"""The result cache's third layer (L3): a query's answer found by the nearest earlier query alike in
meaning, in the same namespace, vector space and request context (pgvector, `result_stores.PgQueryIndex`).

A query is embedded once per request (`Lookup.vector`), only when it has text within `max_query_chars`;
an embedding that fails or takes longer than `embedding_timeout_s` skips the tier for that request
(counted by reason). Vectors that can no longer be found are deleted by `sweep`: those past their expiry,
and those of an epoch a bump retired (unreachable at once, as the epoch is in their scope), which a bump
brings the next sweep forward for; past `max_query_vectors`, the soonest to expire go first.
"""

from __future__ import annotations

import asyncio
import contextlib

from warmplane.services.gateway.metrics import GatewayMetrics
from warmplane.services.gateway.result_lookup import Lookup
from warmplane.services.gateway.result_stores import QueryIndex, QueryScope
from warmplane.services.gateway.settings import ResultCacheSettings
from warmplane.services.gateway.text_embedding import Embedder


class SemanticTier:
    def __init__(
        self, settings: ResultCacheSettings, index: QueryIndex, embedder: Embedder, metrics: GatewayMetrics
    ) -> None:
        self._settings = settings
        self._index = index
        self._embedder = embedder
        self._metrics = metrics
        self._retired: dict[tuple[str, str], int] = {}
        """(tenant, model) → the epoch below which its vectors are still to be deleted."""
        self._due = asyncio.Event()

    async def nearest(self, found: Lookup) -> tuple[str, float] | None:
        """(answer key, similarity) of the nearest earlier query at least `similarity` alike, if any.
        Raises what the index raises."""
        vector = await self._vector(found)
        if vector is None:
            return None
        nearest = await self._index.nearest(self._scope(found), vector)
        return None if nearest is None or nearest[1] < self._settings.similarity else nearest

    async def add(self, found: Lookup, ttl_s: float) -> None:
        """Point `found`'s query at its answer for `ttl_s`. Raises what the index raises."""
        vector = await self._vector(found)
        if vector is not None:
            await self._index.add(self._scope(found), vector, found.key, ttl_s)

    async def _vector(self, found: Lookup) -> list[float] | None:
        """The query's embedding (computed once), or None when the tier does not apply to it."""
        text = found.query.text
        if found.vector is None and text and len(text) <= self._settings.max_query_chars:
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

    def retire(self, tenant: str, model: str, epoch: int) -> None:
        """(tenant, model) moved to `epoch`: its older epochs' vectors go at the next sweep."""
        self._retired[(tenant, model)] = max(epoch, self._retired.get((tenant, model), 0))
        self._due.set()

    async def next_sweep(self, every_s: float) -> None:
        """Return after `every_s`, or sooner once a bump left vectors to delete."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(every_s):
                await self._due.wait()
        self._due.clear()

    async def sweep(self, limit: int) -> int:
        """Delete retired epochs' vectors (at most `limit` per (tenant, model)), then at most `limit`
        expired ones, then at most `limit` of those past `max_query_vectors` (the soonest to expire);
        how many were deleted. Raises what the index raises; a later sweep deletes the
        rest."""
        deleted = 0
        for pair, epoch in list(self._retired.items()):
            swept = await self._index.retire(*pair, epoch, limit)
            deleted += swept
            if swept < limit and self._retired.get(pair) == epoch:
                del self._retired[pair]
        deleted += await self._index.sweep(limit)
        return deleted + await self._index.trim(self._settings.max_query_vectors, limit)
