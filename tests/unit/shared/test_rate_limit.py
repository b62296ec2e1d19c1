"""The per-tenant token bucket (`shared/rate_limit.py`) and the API's reused answers
(`services/api/answer_cache.py`): pure logic on a hand-moved clock."""

from __future__ import annotations

import asyncio

import pytest

from warmplane.services.api.answer_cache import AnswerCache
from warmplane.shared.rate_limit import RateLimiter, RateLimitSettings


def test_a_key_gets_its_burst_then_waits_for_the_refill_and_keys_do_not_share() -> None:
    limiter = RateLimiter(RateLimitSettings(requests_per_s=2, burst=3))
    assert [limiter.take("acme", 0.0) for _ in range(3)] == [0, 0, 0]
    assert limiter.take("acme", 0.0) == 1  # half a second to one more, said as whole seconds
    assert limiter.take("globex", 0.0) == 0
    assert limiter.take("acme", 0.5) == 0 and limiter.take("acme", 0.5) == 1
    assert [limiter.take("acme", 100.0) for _ in range(4)] == [0, 0, 0, 1]  # refilled to burst, no more


def test_a_slow_rate_says_how_long_to_wait_and_zero_turns_the_limit_off() -> None:
    slow = RateLimiter(RateLimitSettings(requests_per_s=0.01, burst=1))
    assert (slow.take("acme", 0.0), slow.take("acme", 0.0), slow.take("acme", 50.0)) == (0, 100, 50)
    off = RateLimiter(RateLimitSettings())
    assert not off.enabled and all(off.take("acme", 0.0) == 0 for _ in range(10_000))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_callers_at_once_share_one_computation_and_a_fresh_answer_is_reused() -> None:
    clock = Clock()
    cache: AnswerCache[int] = AnswerCache(10.0, 8, clock)
    computed: list[str] = []
    release = asyncio.Event()

    async def compute() -> int:
        computed.append("x")
        await release.wait()
        return len(computed)

    waiting = [asyncio.create_task(cache.get("k", compute)) for _ in range(5)]
    await asyncio.sleep(0)  # let every caller reach the cache: a scheduling step, not a wait for a condition
    release.set()
    assert await asyncio.gather(*waiting) == [1] * 5 and len(computed) == 1
    clock.now = 9.9
    assert await cache.get("k", compute) == 1
    clock.now = 10.0
    assert await cache.get("k", compute) == 2


async def test_a_failed_computation_is_not_kept_and_the_cache_stays_bounded() -> None:
    clock = Clock()
    cache: AnswerCache[str] = AnswerCache(10.0, 2, clock)

    async def fail() -> str:
        raise OSError("Postgres went away")

    with pytest.raises(OSError, match="went away"):
        await cache.get("k", fail)

    async def answer(value: str) -> str:
        return value

    assert await cache.get("k", lambda: answer("a")) == "a"
    await cache.get("k2", lambda: answer("b"))
    await cache.get("k3", lambda: answer("c"))  # the oldest, "k", makes room
    assert await cache.get("k", lambda: answer("again")) == "again"
    assert await cache.get("k3", lambda: answer("not asked")) == "c"


async def test_no_ttl_computes_every_time() -> None:
    cache: AnswerCache[int] = AnswerCache(0.0, 8, Clock())
    calls = iter(range(10))

    async def compute() -> int:
        return next(calls)

    assert [await cache.get("k", compute) for _ in range(3)] == [0, 1, 2]
