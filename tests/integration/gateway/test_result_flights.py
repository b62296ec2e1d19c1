"""Single flight on the real stores: identical misses make one call to a replica, in a pod (a shared
future) and across pods (a Redis lease); a leader that fails or is slow sends its followers to a replica,
never to an error."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import asyncpg
import redis.asyncio as aioredis

from tests.integration.result_cache_harness import MODEL, answer, cache, chat, lookups
from warmplane.services.gateway.openai_request import ClientRequest
from warmplane.services.gateway.result_cache import ResultCache
from warmplane.services.gateway.result_keys import Namespace, cache_query
from warmplane.services.gateway.result_lookup import answer_key
from warmplane.services.gateway.single_flight import lease_key


class CountingReplica:
    """A pretend replica: counts its calls (`called` is set by the first); each answers once `release`
    is set."""

    def __init__(self, text: str, *, fails: bool = False) -> None:
        self.calls = 0
        self.called = asyncio.Event()
        self.release = asyncio.Event()
        self._text, self._fails = text, fails

    async def answer(self) -> bytes | None:
        self.calls += 1
        self.called.set()
        await self.release.wait()
        return None if self._fails else answer(self._text)


async def serve(results: ResultCache, request: ClientRequest, tenant: str, replica: CountingReplica) -> str:
    """One request as the proxy serves it: where its answer came from (a tier, or `replica`)."""
    found = await results.lookup(request, tenant, 0, {})
    assert found is not None
    if found.follows:
        await results.follow(found)
    if found.hit is not None:
        return found.hit.tier
    content = await replica.answer()
    if content is None:
        results.abandon(found)
    else:
        results.keep(found, content)
    return "replica"


async def test_twenty_identical_misses_in_a_pod_make_one_call_to_a_replica(
    answers_redis: aioredis.Redis, pool: asyncpg.Pool
) -> None:
    results, metrics = cache(answers_redis, pool)
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    replica = CountingReplica("Canberra.")
    requests = [
        asyncio.ensure_future(serve(results, chat("What is the capital of Australia?"), tenant, replica))
        for _ in range(20)
    ]
    async with asyncio.timeout(10):
        await replica.called.wait()  # the leader reached the replica: the others follow it
    replica.release.set()
    served = Counter(await asyncio.gather(*requests))
    assert served == {"replica": 1, "flight": 19}
    assert replica.calls == 1
    assert (lookups(metrics, tenant, "miss"), lookups(metrics, tenant, "flight")) == (1, 19)
    await results.drain(5)
    key = answer_key(
        Namespace(tenant, MODEL, 0), cache_query(chat("What is the capital of Australia?")).exact
    )
    assert not await answers_redis.exists(lease_key(key)), "the lease is released"


async def test_when_the_leader_gets_no_answer_its_followers_go_to_a_replica_not_to_an_error(
    answers_redis: aioredis.Redis,
) -> None:
    results, _ = cache(answers_redis, None)
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    failing = CountingReplica("", fails=True)
    leader = asyncio.ensure_future(serve(results, chat("Name a glacier."), tenant, failing))
    async with asyncio.timeout(10):
        await failing.called.wait()
    found = await results.lookup(chat("Name a glacier."), tenant, 0, {})
    assert found is not None and found.follows and not found.leads
    following = asyncio.ensure_future(results.follow(found))
    failing.release.set()
    assert await leader == "replica"
    await following
    assert found.hit is None and found.keep, "it goes to a replica itself, and keeps that answer"


async def test_a_follower_waits_no_longer_than_the_flight_timeout(answers_redis: aioredis.Redis) -> None:
    results, metrics = cache(answers_redis, None, flight_timeout_s=0.2)
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    leader = await results.lookup(chat("Name a volcano."), tenant, 0, {})
    assert leader is not None and leader.leads  # and never lands: a stuck replica
    follower = await results.lookup(chat("Name a volcano."), tenant, 0, {})
    assert follower is not None and follower.follows
    async with asyncio.timeout(5):
        await results.follow(follower)
    assert follower.hit is None and lookups(metrics, tenant, "miss") == 2
    results.abandon(leader)


async def test_across_pods_the_lease_holder_answers_for_both(answers_redis: aioredis.Redis) -> None:
    pod_a, _ = cache(answers_redis, None)
    pod_b, metrics_b = cache(answers_redis, None, flight_poll_s=0.01)
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    question = chat("Name a fjord.")
    leader = await pod_a.lookup(question, tenant, 0, {})
    assert leader is not None and leader.leads and leader.lease is not None and not leader.follows
    assert await answers_redis.exists(lease_key(leader.key))

    waiting = await pod_b.lookup(question, tenant, 0, {})
    assert waiting is not None and waiting.remote and waiting.follows, "pod B finds the lease held"
    local = await pod_b.lookup(question, tenant, 0, {})
    assert local is not None and local.follows and not local.leads, "pod B's own twin follows B's leader"
    following = asyncio.gather(pod_b.follow(waiting), pod_b.follow(local))
    pod_a.keep(leader, answer("The Sognefjord."))
    async with asyncio.timeout(10):
        await following
    assert waiting.hit is not None and local.hit is not None
    assert waiting.hit.answer == local.hit.answer == answer("The Sognefjord.")
    assert lookups(metrics_b, tenant, "flight") == 2
    assert not await answers_redis.exists(lease_key(leader.key))
    again = await pod_b.lookup(question, tenant, 0, {})
    assert again is not None and again.hit is not None and again.hit.tier == "l1"


async def test_across_pods_a_lease_given_up_sends_the_waiting_pod_to_a_replica(
    answers_redis: aioredis.Redis,
) -> None:
    pod_a, _ = cache(answers_redis, None)
    pod_b, _ = cache(answers_redis, None, flight_poll_s=0.01)
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    leader = await pod_a.lookup(chat("Name a delta."), tenant, 0, {})
    waiting = await pod_b.lookup(chat("Name a delta."), tenant, 0, {})
    assert leader is not None and waiting is not None and waiting.remote
    following = asyncio.ensure_future(pod_b.follow(waiting))
    pod_a.abandon(leader)  # its replica failed
    async with asyncio.timeout(10):  # well before the 30 s the lease would have lasted
        await following
    assert waiting.hit is None and waiting.keep and waiting.leads and not waiting.follows
