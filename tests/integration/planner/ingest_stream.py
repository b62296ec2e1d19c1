"""A request stream with a producer's retried duplicates, its true counts, and the checks that a planner
counted it exactly once: shared by the tests that interrupt ingestion (a planner killed, Postgres
stopped)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.integration.planner_harness import request
from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.events import Event, RequestObserved
from warmplane.shared.topics import Topics

TENANTS = ("acme", "globex", "initech")
COUNTED = "SELECT coalesce(sum(requests), 0) FROM prefix_requests"
SUMMED = (
    "SELECT (SELECT coalesce(sum({0}), 0) FROM prefix_stats)"
    " + (SELECT coalesce(sum({0}), 0) FROM scope_traffic)"
)
"""A request sum over every request: each is in `prefix_stats` or, at a leaf its batch added, in
`scope_traffic` (migration 0017)."""


@dataclass(frozen=True, slots=True)
class Stream:
    events: list[Event]
    by_leaf: Counter[tuple[str, int]]
    """The true request count per (tenant, leaf prefix)."""
    by_replica: Counter[tuple[str, str]]
    """The true request count per (replica, tenant)."""

    @property
    def total(self) -> int:
        return sum(self.by_leaf.values())


def retried_stream(seed: int, count: int) -> Stream:
    """`count` requests over shared roots, served by 8 replicas, 2% of them published twice (as a
    producer's retry does: the copy a few thousand messages later)."""
    rng = random.Random(seed)
    events: list[Event] = []
    for _ in range(count):
        root = rng.randrange(40)
        events.append(
            request(
                [root, root * 1_000 + rng.randrange(50)],
                tenant=rng.choice(TENANTS),
                replica=f"r-{rng.randrange(8)}",
            )
        )
    for original in sorted(rng.sample(range(count), count // 50), reverse=True):
        events.insert(min(len(events), original + rng.randrange(1, 5_000)), events[original])
    unique = [e for e in {e.event_id: e for e in events}.values() if isinstance(e, RequestObserved)]
    return Stream(
        events,
        Counter((e.tenant, e.chain[-1]) for e in unique),
        Counter((e.replica, e.tenant) for e in unique),
    )


async def committed_offsets(settings: PlannerSettings) -> dict[int, int]:
    """The planner group's committed offset per partition of the requests topic (read, not joined)."""
    topic = Topics(settings.kafka.topic_prefix).requests
    partitions = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(settings.ingest.group_id, partitions=partitions)
    finally:
        await admin.close()
    return {tp.partition: committed[tp].offset for tp in partitions if tp in committed}


async def group_lag(settings: PlannerSettings) -> int:
    """Messages on the requests topic not yet committed by the planner's group."""
    topic = Topics(settings.kafka.topic_prefix).requests
    partitions = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
    committed = await committed_offsets(settings)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
    return sum(ends[tp] - committed.get(tp.partition, 0) for tp in partitions)


async def drained(db: asyncpg.Connection, settings: PlannerSettings, stream: Stream) -> bool:
    """Every event counted and every offset committed. Tansu reports a partition's end as its last batch's
    base offset + 1, so a fully committed group shows a lag at or below zero there (Kafka shows zero)."""
    return bool(await db.fetchval(COUNTED) >= stream.total and await group_lag(settings) <= 0)


async def assert_counted_once(db: asyncpg.Connection, stream: Stream) -> None:
    """Per (tenant, leaf), per (replica, tenant), the ledger and the tokens: each event exactly once."""
    rows = await db.fetch(
        "SELECT s.tenant, p.prefix_id, sum(p.requests) AS n"
        " FROM prefix_requests p JOIN scopes s USING (scope_id) GROUP BY 1, 2"
    )
    assert Counter({(r["tenant"], r["prefix_id"]): r["n"] for r in rows}) == stream.by_leaf
    # Written in the same transaction as the counts above: exact per replica as well.
    rows = await db.fetch(
        "SELECT r.replica, s.tenant, sum(r.requests) AS n"
        " FROM replica_stats r JOIN scopes s USING (scope_id) GROUP BY 1, 2"
    )
    assert Counter({(r["replica"], r["tenant"]): r["n"] for r in rows}) == stream.by_replica
    assert await db.fetchval("SELECT sum(length(event_ids)) / 16 FROM ingest_ledger") == stream.total
    tokens = await db.fetchval(SUMMED.format("prompt_tokens"))
    assert tokens == stream.total * 201  # every request here has 200 chain tokens + 1
