"""Answers of an expensive read reused for a while (`/v1/warm-sets`): callers asking the same key within
`ttl_s` get the same answer, and callers asking at once share one computation.

Bounded: at most `max_entries` keys are kept (expired ones go first, then the oldest). A computation that
raises is not kept: each of its waiters gets the error, and the next caller computes again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class AnswerCache(Generic[V]):
    def __init__(self, ttl_s: float, max_entries: int, monotonic: Callable[[], float]) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._monotonic = monotonic
        self._entries: dict[Hashable, tuple[float, asyncio.Future[V]]] = {}

    async def get(self, key: Hashable, compute: Callable[[], Awaitable[V]]) -> V:
        """The answer for `key`: kept if younger than `ttl_s` (or being computed), else `compute()`'s."""
        if self._ttl_s <= 0:
            return await compute()
        now = self._monotonic()
        found = self._entries.get(key)
        if found is not None and found[0] > now:
            return await asyncio.shield(found[1])
        self._make_room(now)
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._entries[key] = (now + self._ttl_s, future)
        try:
            answer = await compute()
        except BaseException as exc:
            if self._entries.get(key, (0.0, None))[1] is future:
                del self._entries[key]
            future.set_exception(exc if isinstance(exc, Exception) else RuntimeError("cancelled"))
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        future.set_result(answer)
        return answer

    def _make_room(self, now: float) -> None:
        if len(self._entries) < self._max_entries:
            return
        for key in [k for k, (expires, future) in self._entries.items() if expires <= now and future.done()]:
            del self._entries[key]
        while len(self._entries) >= self._max_entries:
            del self._entries[next(iter(self._entries))]
