"""A planner killed (SIGKILL, a real process) mid-stream and restarted counts every event exactly once."""

from __future__ import annotations

import os
import random
import signal
from collections import Counter
from pathlib import Path

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.integration.planner_harness import poll_until, produce, request, start_planner_process
from warmplane.services.planner.settings import IngestSettings, PlannerSettings
from warmplane.shared.events import Event, RequestObserved
from warmplane.shared.topics import Topics

EVENTS = 120_000
TENANTS = ("acme", "globex", "initech")


def _stream(seed: int) -> tuple[list[Event], Counter[tuple[str, int]], Counter[tuple[str, str]]]:
    """Requests over shared roots, served by 8 replicas, 2% of them published twice (as a producer's
    retry does: the copy a few thousand messages later); and the true counts per (tenant, leaf) and
    per (replica, tenant)."""
    rng = random.Random(seed)
    events: list[Event] = []
    for _ in range(EVENTS):
        root = rng.randrange(40)
        events.append(
            request(
                [root, root * 1_000 + rng.randrange(50)],
                tenant=rng.choice(TENANTS),
                replica=f"r-{rng.randrange(8)}",
            )
        )
    for original in sorted(rng.sample(range(EVENTS), EVENTS // 50), reverse=True):
        events.insert(min(len(events), original + rng.randrange(1, 5_000)), events[original])
    unique = [e for e in {e.event_id: e for e in events}.values() if isinstance(e, RequestObserved)]
    return (
        events,
        Counter((e.tenant, e.chain[-1]) for e in unique),
        Counter((e.replica, e.tenant) for e in unique),
    )


async def _lag(settings: PlannerSettings) -> int:
    """Messages on the requests topic not yet committed by the planner's group (read, not joined)."""
    topic = Topics(settings.kafka.topic_prefix).requests
    partitions = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(settings.ingest.group_id, partitions=partitions)
        ends = await consumer.end_offsets(partitions)
        return sum(ends[tp] - (committed[tp].offset if tp in committed else 0) for tp in partitions)
    finally:
        await consumer.stop()
        await admin.close()


async def test_sigkill_mid_batch_neither_loses_nor_double_counts(
    planner_settings: PlannerSettings, tmp_path: Path
) -> None:
    settings = planner_settings.model_copy(
        update={"ingest": IngestSettings(group_id=planner_settings.ingest.group_id, batch_max_records=1_000)}
    )
    events, truth, by_replica = _stream(seed=7)
    await produce(settings.kafka, events)
    total = sum(truth.values())
    db = await asyncpg.connect(settings.postgres.asyncpg_dsn())
    counted = "SELECT coalesce(sum(requests), 0) FROM prefix_stats"
    try:
        first = start_planner_process(settings, tmp_path / "planner-1.log")
        try:

            async def some_counted() -> bool:
                return bool(await db.fetchval(counted) >= total // 5)

            await poll_until(some_counted, timeout_s=60, what="a fifth of the stream counted")
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
        at_kill = await db.fetchval(counted)
        assert at_kill < total, "the planner finished before it was killed: the test proved nothing"

        second = start_planner_process(settings, tmp_path / "planner-2.log")
        try:

            async def drained() -> bool:
                # Tansu reports a partition's end as its last batch's base offset + 1, so a fully
                # committed group shows a lag at or below zero there (Apache Kafka shows zero).
                return bool(await db.fetchval(counted) >= total and await _lag(settings) <= 0)

            await poll_until(drained, timeout_s=120, what="the restarted planner to drain the stream")
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0, (tmp_path / "planner-2.log").read_text()[-3000:]

        rows = await db.fetch(
            "SELECT s.tenant, p.prefix_id, sum(p.requests) AS n"
            " FROM prefix_stats p JOIN scopes s USING (scope_id) GROUP BY 1, 2"
        )
        assert Counter({(r["tenant"], r["prefix_id"]): r["n"] for r in rows}) == truth
        # Written in the same transaction as the counts above: exact per replica as well.
        rows = await db.fetch(
            "SELECT r.replica, s.tenant, sum(r.requests) AS n"
            " FROM replica_stats r JOIN scopes s USING (scope_id) GROUP BY 1, 2"
        )
        assert Counter({(r["replica"], r["tenant"]): r["n"] for r in rows}) == by_replica
        assert await db.fetchval("SELECT sum(length(event_ids)) / 16 FROM ingest_ledger") == total
        tokens = await db.fetchval("SELECT sum(prompt_tokens) FROM prefix_stats")
        assert tokens == total * 201  # every request here has 200 chain tokens + 1
    finally:
        await db.close()
