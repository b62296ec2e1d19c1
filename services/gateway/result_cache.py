"""The versioned result cache: an answer given once is given again, without a replica, until the
(tenant, model) epoch moves or the answer's time to live runs out.

Contracts:
- Only requests `result_keys.bypass_reason` lets through are looked up or kept; the rest are counted
  by reason and never touch the stores.
- An answer is shared only inside its namespace (tenant, model, epoch; and end user, when the settings
  scope by user): all are part of every key, so no tenant reads another's answers and an epoch bump
  (new weights, new prompt revision, or by hand) makes every answer of the old one unreachable at once.
  The bump also drops the old epoch's answers from L1, deletes them from Redis in the background, and
  the next sweep deletes its query vectors.
- Three layers, looked up in turn: L1, this process's memory (`answer_lru.py`, bounded in entries and
  bytes); L2, Redis, exact; L3, the nearest earlier query of the same context at least `similarity`
  alike (Postgres, pgvector), whose answer must still be in Redis. An answer found in L2 or L3, or
  kept, fills L1. Every time to live gets jitter (`ttl_jitter.py`).
- Single flight: identical misses in one process follow the first (`single_flight.py`); across pods
  the leader holds a Redis lease for `flight_timeout_s`, and another pod's leader waits for the answer
  in Redis while the lease lives. `lookup` says which: `Lookup.leads`, `Lookup.follows`. Waiting ends
  in a replica's answer, never in an error. The caller must end every lookup it did not answer from
  the cache with `keep` or `abandon`, which lands the flight and releases the lease.
- The cache never fails a request: a lookup that errs or takes longer than `lookup_timeout_s` is a
  miss (counted as `error`); an embedding that fails or takes longer than `embedding_timeout_s` skips
  the semantic tier for that request (counted by reason); a stored answer that is not intact
  (`answer_record.py`) is deleted, counted and never served; answers are kept in the background, at
  most `max_pending_keeps` at a time, never awaited by the request that produced them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import asyncpg
import redis

from warmplane.services.gateway.answer_lru import AnswerLru
from warmplane.services.gateway.answer_record import pack, unpack
from warmplane.services.gateway.metrics import GatewayMetrics
from warmplane.services.gateway.openai_request import ClientRequest
from warmplane.services.gateway.result_keys import (
    Namespace,
    bypass_reason,
    cache_query,
    directive,
    end_user,
    namespace_answers,
)
from warmplane.services.gateway.result_lookup import Hit, Lookup, answer_key
from warmplane.services.gateway.result_stores import AnswerStore, QueryIndex
from warmplane.services.gateway.result_warming import HotPrompts
from warmplane.services.gateway.semantic_tier import SemanticTier
from warmplane.services.gateway.settings import ResultCacheSettings
from warmplane.services.gateway.single_flight import Flights, Leases
from warmplane.services.gateway.text_embedding import Embedder
from warmplane.services.gateway.ttl_jitter import jittered

log = logging.getLogger(__name__)
_STORE_ERRORS = (redis.RedisError, OSError, asyncpg.PostgresError, TimeoutError)
_PURGE_LIMIT = 1_000_000
"""Answers of a retired epoch deleted after its bump, at most (the rest expire)."""


class ResultCache:
    """`index` is None when the semantic tier is off. `monotonic` times L1 and flights; `rng` draws the
    jitter; `hot` records what is asked for, for warming (`result_warming.py`; None: no warming)."""

    def __init__(
        self,
        settings: ResultCacheSettings,
        answers: AnswerStore,
        index: QueryIndex | None,
        embedder: Embedder,
        metrics: GatewayMetrics,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        hot: HotPrompts | None = None,
    ) -> None:
        self._settings = settings
        self._answers = answers
        self._semantic = None
        if index is not None and settings.semantic:
            self._semantic = SemanticTier(settings, index, embedder, metrics)
        self._metrics = metrics
        self._monotonic = monotonic
        self._uniform = (rng if rng is not None else random.Random()).uniform
        self._l1 = AnswerLru(settings.l1_max_entries, settings.l1_max_bytes)
        self._hot = hot if settings.warm_entries > 0 else None
        self._flights = Flights()
        self._leases = Leases(answers, settings.flight_poll_s, monotonic)
        self._user_header = settings.user_header.lower()
        self._pending: set[asyncio.Task[None]] = set()
        self._failing = False  # logged once when the stores start failing, once when they recover

    async def lookup(
        self, request: ClientRequest, tenant: str, epoch: int, headers: Mapping[str, str]
    ) -> Lookup | None:
        """The request's `Lookup` (with its `hit`, if any), or None when the cache must stay out of it.
        `headers` are the request's, by lower-case name."""
        wanted = directive(headers)
        reason = bypass_reason(request, wanted)
        user = None
        if reason is None and self._settings.scope_by_user:
            user = end_user(request, headers, self._user_header)
            reason = "no_user" if user is None else None
        if reason is not None:
            self._metrics.result_bypass.labels(tenant, request.model, reason).inc()
            return None
        namespace = Namespace(tenant, request.model, epoch)
        query = cache_query(request, user)
        found = Lookup(namespace, query, answer_key(namespace, query.exact), keep=True)
        if self._hot is not None:
            self._hot.note(namespace, found.key)
        if not wanted.lookup:
            self._metrics.result_bypass.labels(tenant, request.model, "no_cache").inc()
            return found
        now = self._monotonic()
        answer = self._l1.get(found.key, now)
        if answer is not None:
            found.hit, found.keep = Hit(answer, "l1", 1.0), False
            self._count(found, "l1")
            return found
        found.flight, found.leads = self._flights.join(found.key, now, self._settings.flight_timeout_s)
        if found.leads:
            outcome = await self._look_further(found)
            if not found.remote:
                self._count(found, outcome)
        return found

    async def _look_further(self, found: Lookup) -> str:
        """L2, then L3; on a miss, the flight's Redis lease. The outcome to count."""
        try:
            async with asyncio.timeout(self._settings.lookup_timeout_s):
                found.hit = await self._find(found)
                if found.hit is None:
                    found.lease = await self._leases.take(found.key, self._settings.flight_timeout_s)
                    found.remote = found.lease is None
        except _STORE_ERRORS as exc:
            self._note_failure(exc)
            return "error"
        self._note_success()
        if found.hit is None:
            return "miss"
        found.keep = False
        self._hold(found, found.hit.answer)
        self._land(found, found.hit.answer)
        return found.hit.tier

    async def _find(self, found: Lookup) -> Hit | None:
        answer = await self._intact(found, found.key, await self._answers.get(found.key))
        if answer is not None:
            return Hit(answer, "exact", 1.0)
        nearest = None if self._semantic is None else await self._semantic.nearest(found)
        if nearest is None:
            return None
        answer = await self._intact(found, nearest[0], await self._answers.get(nearest[0]))
        return None if answer is None else Hit(answer, "semantic", nearest[1])

    async def _intact(self, found: Lookup, key: str, stored: bytes | None) -> bytes | None:
        """The answer stored under `key`; a stored value that is not intact is deleted and counted."""
        if stored is None:
            return None
        answer = unpack(stored)
        if answer is None:
            self._metrics.result_corrupt.labels(found.namespace.model).inc()
            await self._answers.delete(key)
        return answer

    async def follow(self, found: Lookup) -> None:
        """Wait for the flight `found` follows: sets `found.hit` (tier `flight`) if it brings an answer;
        if not, the request goes to a replica and its answer is kept as any other's."""
        flight = found.flight
        if flight is None:
            return
        if found.leads:
            answer = await self._from_other_pod(found, flight.deadline)
            found.remote = False
            if answer is not None:
                self._hold(found, answer)
                self._land(found, answer)
        else:
            answer = await self._flights.wait(flight, self._monotonic())
            found.flight = None
        if answer is not None:
            found.hit, found.keep = Hit(answer, "flight", 1.0), False
        self._count(found, "miss" if answer is None else "flight")

    async def _from_other_pod(self, found: Lookup, deadline: float) -> bytes | None:
        """The answer another pod's leader keeps, while its lease lives; None if it never comes."""

        async def read() -> bytes | None:
            return await self._intact(found, found.key, await self._answers.get(found.key))

        try:
            return await self._leases.await_answer(found.key, deadline, read)
        except _STORE_ERRORS as exc:
            self._note_failure(exc)
            return None

    def keep(self, found: Lookup, answer: bytes) -> None:
        """Keep a replica's 200 answer for `found`'s request: its followers get it now, L1 holds it, and
        Redis and Postgres get it in the background."""
        model = found.namespace.model
        if not found.keep:
            return
        found.keep = False
        self._land(found, answer)
        holder, found.lease = found.lease, None
        if len(answer) > self._settings.max_answer_bytes:
            self._metrics.result_keeps.labels(model, "too_large").inc()
            self._spawn(self._release(found.key, holder))
            return
        self._hold(found, answer)
        if not self._spawn(self._keep(found, answer, holder)):
            self._metrics.result_keeps.labels(model, "dropped").inc()  # its lease dies by its deadline

    def abandon(self, found: Lookup) -> None:
        """End `found` without an answer to keep: its followers go to a replica themselves."""
        found.keep = False
        self._land(found, None)
        holder, found.lease = found.lease, None
        self._spawn(self._release(found.key, holder))

    async def _keep(self, found: Lookup, answer: bytes, holder: str | None) -> None:
        ttl_s = jittered(self._settings.ttl_s, self._settings.ttl_jitter, self._uniform)
        model = found.namespace.model
        try:
            try:
                await self._answers.put(found.key, pack(answer), ttl_s)
            finally:  # the answer is there to be read (or never will be): waiters may look
                await self._release(found.key, holder)
            if self._semantic is not None:
                await self._semantic.add(found, ttl_s)
        except _STORE_ERRORS as exc:
            self._metrics.result_keeps.labels(model, "error").inc()
            self._note_failure(exc)
            return
        self._metrics.result_keeps.labels(model, "kept").inc()

    def _hold(self, found: Lookup, answer: bytes) -> None:
        settings = self._settings
        ttl_s = jittered(min(settings.l1_ttl_s, settings.ttl_s), settings.ttl_jitter, self._uniform)
        self._l1.put(found.key, found.namespace, answer, self._monotonic() + ttl_s)

    def _land(self, found: Lookup, answer: bytes | None) -> None:
        if found.leads and found.flight is not None:
            self._flights.land(found.key, found.flight, answer)
            found.flight = None

    async def _release(self, key: str, holder: str | None) -> None:
        """Release the lease `holder` holds on `key`, if any (unreleased, it dies by its deadline)."""
        if holder is not None:
            with contextlib.suppress(*_STORE_ERRORS):
                await self._leases.release(key, holder)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> bool:
        """Run `work` in the background, unless `max_pending_keeps` tasks already are (False)."""
        if len(self._pending) >= self._settings.max_pending_keeps:
            work.close()
            return False
        task = asyncio.get_running_loop().create_task(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return True

    def _count(self, found: Lookup, outcome: str) -> None:
        namespace = found.namespace
        self._metrics.result_lookups.labels(namespace.tenant, namespace.model, outcome).inc()

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

    def epoch_bumped(self, tenant: str, model: str, epoch: int) -> None:
        """(tenant, model) moved to `epoch`: L1 drops the older epochs' answers now, the next sweep their
        query vectors, and Redis the previous epoch's answers, in the background; L1 is warmed with what
        other pods have kept under the new epoch."""
        self._l1.drop_older(tenant, model, epoch)
        if self._semantic is not None:
            self._semantic.retire(tenant, model, epoch)
        self._spawn(self._purge(Namespace(tenant, model, epoch - 1)))
        if self._hot is not None:
            self._spawn(self._warm_quietly(lambda _t, _m: epoch, (tenant, model)))

    async def _purge(self, old: Namespace) -> None:
        """Delete the answers a bump made unreachable, the epoch before it (older ones were purged at their
        own bump, or have expired); a failing store leaves them to their time to live."""
        if old.epoch < 0:
            return
        try:
            purged = await self._answers.purge(namespace_answers(old), _PURGE_LIMIT)
        except _STORE_ERRORS as exc:
            self._note_failure(exc)
            return
        self._metrics.result_purged.labels(old.model).inc(purged)

    async def warm(
        self, current: Callable[[str, str], int | None], only: tuple[str, str] | None = None
    ) -> int:
        """Hold in L1 the answers behind the `warm_entries` most asked prompts of the last 24 hours, of each
        (tenant, model)'s `current` epoch, or of `only` that pair (`result_warming.py`); how many were
        held. Raises what the stores raise."""
        if self._hot is None:
            return 0
        hot = await self._hot.top(current, self._settings.warm_entries, only)
        stored = await self._hot.fetch([entry.key for entry in hot])
        held = 0
        for entry, value in zip(hot, stored, strict=True):
            answer = None if value is None else unpack(value)
            if answer is None:
                continue
            settings = self._settings
            ttl_s = jittered(min(settings.l1_ttl_s, settings.ttl_s), settings.ttl_jitter, self._uniform)
            self._l1.put(entry.key, entry.namespace, answer, self._monotonic() + ttl_s)
            self._metrics.result_warmed.labels(entry.namespace.model).inc()
            held += 1
        return held

    async def _warm_quietly(
        self, current: Callable[[str, str], int | None], only: tuple[str, str] | None
    ) -> None:
        try:
            await self.warm(current, only)
        except _STORE_ERRORS as exc:
            self._note_failure(exc)

    async def flush_asks(self) -> int:
        """Add the asks counted since the last flush to the fleet's record; how many keys. Raises what
        Redis raises."""
        return 0 if self._hot is None else await self._hot.flush()

    async def next_sweep(self, every_s: float) -> None:
        """Return after `every_s`, or sooner once an epoch bump left query vectors to delete."""
        if self._semantic is None:
            await asyncio.sleep(every_s)
        else:
            await self._semantic.next_sweep(every_s)

    async def sweep(self, limit: int = 10_000) -> int:
        """Delete retired epochs' query vectors and expired ones (Redis expires answers by itself):
        `SemanticTier.sweep`."""
        return 0 if self._semantic is None else await self._semantic.sweep(limit)

    async def drain(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the answers still being kept."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)
