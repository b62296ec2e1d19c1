"""Warming L1: the answers behind the most requested prompts of the last 24 hours, held in this process's
memory before the gateway takes traffic, and again for an epoch a bump moved to.

The record: every pod counts the answer keys its cacheable requests ask for, in memory (a request pays a
dictionary increment), and adds the counts to Redis every few seconds: one sorted set per namespace and
hour, kept 25 hours and trimmed to its `keep_per_hour` most asked keys, and one hash naming the namespaces
recorded. So the record is the fleet's, and a pod that starts inherits it. It holds answer keys (hashes)
and the namespaces' tenant, model and epoch, never a client's text.

Warming reads the record of each (tenant, model)'s current epoch (the one the caller names, else the
newest recorded), sums its last 24 hourly sets, takes the most asked keys across namespaces, fetches their
answers from Redis in one round trip, and hands them to the cache to hold. An epoch that was just bumped
to has no answers until replicas give them: warming it loads what other pods have already kept under it.
The cache never re-asks a replica to warm itself, since it keeps no prompts.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec
import redis.asyncio as aioredis

from warmplane.services.gateway.result_keys import Namespace, namespace_id
from warmplane.shared.redis_keys import RESULT_HOT, RESULT_HOT_SPACES

HOUR_S = 3600
WINDOW_HOURS = 24
_KEPT_S = (WINDOW_HOURS + 1) * HOUR_S


@dataclass(frozen=True, slots=True)
class HotAnswer:
    """A recorded answer key, its namespace, and how often it was asked for in the window."""

    namespace: Namespace
    key: str
    asks: float


class HotPrompts:
    """The fleet's record of asked-for answer keys in Redis (see the module). `clock`: wall seconds."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        keep_per_hour: int = 10_000,
        max_pending: int = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._keep = keep_per_hour
        self._max_pending = max_pending
        self._clock = clock
        self._pending: dict[Namespace, Counter[str]] = {}
        self._pending_keys = 0

    def note(self, namespace: Namespace, key: str) -> None:
        """One ask for `key` in `namespace`, counted in memory until the next `flush`. Past `max_pending`
        distinct keys waiting, further new keys are not counted (the record is a popularity estimate)."""
        counts = self._pending.get(namespace)
        if counts is None:
            if self._pending_keys >= self._max_pending:
                return
            counts = self._pending[namespace] = Counter()
        if key not in counts:
            if self._pending_keys >= self._max_pending:
                return
            self._pending_keys += 1
        counts[key] += 1

    @property
    def waiting(self) -> dict[Namespace, dict[str, int]]:
        """The asks counted since the last flush, by namespace and key."""
        return {namespace: dict(counts) for namespace, counts in self._pending.items()}

    async def flush(self) -> int:
        """Add the counts taken since the last flush to Redis; the keys added. Raises what Redis raises
        (the counts are then dropped: the record is an estimate, and a failing store must not grow this)."""
        pending, self._pending, self._pending_keys = self._pending, {}, 0
        if not pending:
            return 0
        hour = int(self._clock() // HOUR_S)
        pipe = self._client.pipeline(transaction=False)
        for namespace, counts in pending.items():
            nsid = namespace_id(namespace)
            sorted_set = f"{RESULT_HOT}{nsid}:{hour}"
            for key, count in counts.items():
                pipe.zincrby(sorted_set, count, key)
            pipe.expire(sorted_set, _KEPT_S)
            pipe.zremrangebyrank(sorted_set, 0, -self._keep - 1)
            pipe.hset(RESULT_HOT_SPACES, nsid, _SPACE.encode(_space(namespace)).decode())
        await pipe.execute()
        return sum(len(counts) for counts in pending.values())

    async def top(
        self,
        current: Callable[[str, str], int | None],
        limit: int,
        only: tuple[str, str] | None = None,
    ) -> list[HotAnswer]:
        """The `limit` most asked answer keys of the last `WINDOW_HOURS`, over the current epoch of every
        recorded (tenant, model), or of `only` that one: `current(tenant, model)`, or the newest recorded
        when it says None or names an epoch with no record."""
        spaces: dict[bytes, bytes] = await self._client.hgetall(RESULT_HOT_SPACES)  # type: ignore[misc]
        recorded = [_namespace(value) for value in spaces.values()]
        chosen = current_namespaces(
            [
                namespace
                for namespace in recorded
                if namespace is not None and (only is None or (namespace.tenant, namespace.model) == only)
            ],
            current,
        )
        if not chosen or limit <= 0:
            return []
        hour = int(self._clock() // HOUR_S)
        pipe = self._client.pipeline(transaction=False)
        for namespace in chosen:
            nsid = namespace_id(namespace)
            for back in range(WINDOW_HOURS):
                pipe.zrevrange(f"{RESULT_HOT}{nsid}:{hour - back}", 0, limit - 1, withscores=True)
        replies = await pipe.execute()
        asks: Counter[tuple[Namespace, str]] = Counter()
        for index, reply in enumerate(replies):
            namespace = chosen[index // WINDOW_HOURS]
            for member, score in reply:
                asks[(namespace, member.decode() if isinstance(member, bytes) else member)] += score
        return [HotAnswer(namespace, key, count) for (namespace, key), count in asks.most_common(limit)]

    async def fetch(self, keys: Sequence[str]) -> list[bytes | None]:
        """The stored values of `keys`, in one round trip (None where a key has expired)."""
        if not keys:
            return []
        values: list[bytes | None] = await self._client.mget(list(keys))
        return values


class _Space(msgspec.Struct, array_like=True):
    tenant: str
    model: str
    epoch: int


_SPACE = msgspec.json.Encoder()
_SPACE_DECODER = msgspec.json.Decoder(_Space)


def _space(namespace: Namespace) -> _Space:
    return _Space(namespace.tenant, namespace.model, namespace.epoch)


def _namespace(value: bytes) -> Namespace | None:
    try:
        space = _SPACE_DECODER.decode(value)
    except msgspec.DecodeError:
        return None
    return Namespace(space.tenant, space.model, space.epoch)


def current_namespaces(
    recorded: Sequence[Namespace], current: Callable[[str, str], int | None]
) -> list[Namespace]:
    """One namespace per (tenant, model): its current epoch's if recorded, else its newest."""
    by_pair: dict[tuple[str, str], list[Namespace]] = {}
    for namespace in recorded:
        by_pair.setdefault((namespace.tenant, namespace.model), []).append(namespace)
    chosen = []
    for (tenant, model), namespaces in sorted(by_pair.items()):
        epoch = current(tenant, model)
        match = [namespace for namespace in namespaces if namespace.epoch == epoch]
        chosen.append(match[0] if match else max(namespaces, key=lambda namespace: namespace.epoch))
    return chosen
