"""Where the result cache keeps things: answers in Redis, the semantic tier's query vectors in Postgres.

`AnswerStore` holds answers by key, each expiring on its own (Redis `SET ... PX`), and the leases of
single flight across pods: a lease is a key set only if absent (`SET ... NX PX`), naming its holder, so
that it is released by its holder alone and dies by its deadline if the holder does. `QueryIndex` finds,
within one (tenant, model, epoch, vector space, request context), the stored query nearest to a
vector (pgvector's cosine distance `<=>`, table `result_queries`, migrations 0008 and 0014) and names
the answer it points to. It keeps one row per answer and vector space (an answer kept again renews its row);
rows past `expires_at` are never returned and are deleted by `sweep`, rows of a retired epoch by
`retire`. Both raise what their client
raises (`redis.RedisError`, `OSError`, `asyncpg.PostgresError`, `TimeoutError`): the caller decides
that a failing store is a miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import asyncpg
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from warmplane.services.gateway.embedders import MINILM_SPACE
from warmplane.services.gateway.result_keys import Namespace
from warmplane.services.gateway.result_warming import HotPrompts
from warmplane.shared.settings import RedisSettings


@dataclass(frozen=True, slots=True)
class QueryScope:
    """The queries one query may be compared with: same namespace, vector space and request context."""

    namespace: Namespace
    space: str
    context: bytes

    def parameters(self) -> tuple[str, str, int, str, bytes]:
        namespace = self.namespace
        return namespace.tenant, namespace.model, namespace.epoch, self.space, self.context


class AnswerStore(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, answer: bytes, ttl_s: float) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def purge(self, prefix: str, limit: int) -> int:
        """Delete up to `limit` keys that start with `prefix`; how many."""
        ...

    async def lease(self, key: str, holder: str, ttl_s: float) -> bool:
        """Take the lease `key` for `holder` for `ttl_s`; False when another holds it."""
        ...

    async def held(self, key: str) -> bool:
        """Whether anyone holds the lease `key`."""
        ...

    async def release(self, key: str, holder: str) -> None:
        """Give the lease `key` up, if `holder` still holds it."""
        ...


class QueryIndex(Protocol):
    async def nearest(self, scope: QueryScope, vector: list[float]) -> tuple[str, float] | None:
        """(answer key, cosine similarity) of the nearest live query, or None when there is none."""
        ...

    async def add(self, scope: QueryScope, vector: list[float], key: str, ttl_s: float) -> None: ...

    async def sweep(self, limit: int) -> int:
        """Delete at most `limit` expired rows; how many were deleted."""
        ...

    async def retire(self, tenant: str, model: str, epoch: int, limit: int) -> int:
        """Delete at most `limit` rows of (tenant, model) from epochs before `epoch`; how many were."""
        ...

    async def trim(self, keep: int, limit: int) -> int:
        """Delete the soonest to expire of the rows past `keep`, at most `limit`; how many were."""
        ...


@dataclass(frozen=True, slots=True)
class ResultStores:
    answers: AnswerStore
    index: QueryIndex | None
    """None when the semantic tier is off."""
    hot: HotPrompts | None = None
    """The fleet's record of asked-for answers, for warming L1 (None: no warming)."""


def redis_client(settings: RedisSettings) -> aioredis.Redis:
    """A client that fails fast: every call bounded by `socket_timeout_s`, never retried (redis-py
    retries three times with seconds of backoff by default; for a cache a miss is cheaper)."""
    return aioredis.Redis.from_url(
        settings.url.get_secret_value(),
        socket_timeout=settings.socket_timeout_s,
        socket_connect_timeout=settings.socket_timeout_s,
        retry=Retry(NoBackoff(), 0),
    )


class RedisAnswers:
    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client

    async def get(self, key: str) -> bytes | None:
        answer: bytes | None = await self._client.get(key)
        return answer

    async def put(self, key: str, answer: bytes, ttl_s: float) -> None:
        await self._client.set(key, answer, px=_ms(ttl_s))

    async def delete(self, key: str) -> None:
        await self._client.delete(key)

    async def purge(self, prefix: str, limit: int) -> int:
        """SCAN for the prefix's keys and UNLINK them in batches (Redis frees them in the background)."""
        purged, batch = 0, []
        async for key in self._client.scan_iter(match=_glob(prefix) + "*", count=1_000):
            batch.append(key)
            if len(batch) >= 1_000:
                purged += await self._client.unlink(*batch)
                batch = []
            if purged + len(batch) >= limit:
                break
        if batch:
            purged += await self._client.unlink(*batch)
        return purged

    async def lease(self, key: str, holder: str, ttl_s: float) -> bool:
        return bool(await self._client.set(key, holder, px=_ms(ttl_s), nx=True))

    async def held(self, key: str) -> bool:
        return bool(await self._client.exists(key))

    async def release(self, key: str, holder: str) -> None:
        await self._client.eval(_RELEASE, 1, key, holder)  # type: ignore[misc]


_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


def _glob(prefix: str) -> str:
    """`prefix` with Redis's glob characters escaped."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in prefix)


def _ms(seconds: float) -> int:
    return max(int(seconds * 1000), 1)


HNSW_SPACES = {MINILM_SPACE: 384}
"""The vector spaces with an HNSW index (migration 0014), and the dimension it was built for."""
_NEAREST = """
SELECT answer_key, 1 - (embedding{cast} <=> $6::text::vector{cast}) AS similarity
FROM result_queries
WHERE tenant = $1 AND model = $2 AND epoch = $3 AND space = $4 AND context = $5 AND expires_at > now(){only}
ORDER BY embedding{cast} <=> $6::text::vector{cast}
LIMIT 1
"""
_SESSION = "SET hnsw.iterative_scan = strict_order; SET plan_cache_mode = force_custom_plan"
"""Per session (the pool resets sessions on release). An HNSW scan goes on past the first candidates until
rows of the namespace turn up, in order (pgvector 0.8): without it, a namespace that is a small part of the
space would find nothing. And every execution is planned for its own values: after five, Postgres would
switch the prepared search to a generic plan, which does not know the namespace's size and took 285 ms a
search at 5,000 rows where the planned one took 3 ms (`bench.result_layers_bench`)."""


def nearest_query(space: str) -> str:
    """The nearest-row query of `space`: for a space with an HNSW index, in the terms of its expression and
    predicate (a cast to its dimension; the space named in the text), so the planner may use it."""
    dimensions = HNSW_SPACES.get(space)
    if dimensions is None:
        return _NEAREST.format(cast="", only="")
    return _NEAREST.format(cast=f"::vector({dimensions})", only=f" AND space = '{space}'")


_ADD = """
INSERT INTO result_queries (tenant, model, epoch, space, context, embedding, answer_key, expires_at)
VALUES ($1, $2, $3, $4, $5, $6::text::vector, $7, now() + make_interval(secs => $8))
ON CONFLICT (answer_key, space) DO UPDATE SET expires_at = excluded.expires_at
"""
_RETIRE = """
DELETE FROM result_queries WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM result_queries WHERE tenant = $1 AND model = $2 AND epoch < $3 LIMIT $4
))
"""
_TRIM = """
DELETE FROM result_queries WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM result_queries ORDER BY expires_at
    LIMIT LEAST(GREATEST((SELECT count(*) FROM result_queries) - $1, 0), $2)
))
"""
_SWEEP = """
DELETE FROM result_queries WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM result_queries WHERE expires_at <= now() LIMIT $1
))
"""


class PgQueryIndex:
    """Nearest-neighbour search over the rows of one namespace and context: exact where a btree narrows
    them to few, approximate (HNSW) for a large namespace of a space in `HNSW_SPACES`, as the planner
    chooses. An approximate search may miss a nearer row (a miss, never a wrong answer: the similarity
    threshold still holds)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._queries: dict[str, str] = {}

    async def nearest(self, scope: QueryScope, vector: list[float]) -> tuple[str, float] | None:
        query = self._queries.get(scope.space)
        if query is None:
            query = self._queries[scope.space] = nearest_query(scope.space)
        async with self._pool.acquire() as connection:
            if scope.space in HNSW_SPACES:
                await connection.execute(_SESSION)
            row = await connection.fetchrow(query, *scope.parameters(), _literal(vector))
        return None if row is None else (row["answer_key"], float(row["similarity"]))

    async def add(self, scope: QueryScope, vector: list[float], key: str, ttl_s: float) -> None:
        await self._pool.execute(_ADD, *scope.parameters(), _literal(vector), key, ttl_s)

    async def sweep(self, limit: int) -> int:
        return _deleted(await self._pool.execute(_SWEEP, limit))

    async def retire(self, tenant: str, model: str, epoch: int, limit: int) -> int:
        return _deleted(await self._pool.execute(_RETIRE, tenant, model, epoch, limit))

    async def trim(self, keep: int, limit: int) -> int:
        return _deleted(await self._pool.execute(_TRIM, keep, limit))


def _deleted(status: str) -> int:
    """The row count of a `DELETE n` command status."""
    return int(status.rsplit(" ", 1)[1])


def _literal(vector: list[float]) -> str:
    """pgvector's text form, `[x,y,...]`."""
    return "[" + ",".join(map(repr, vector)) + "]"
