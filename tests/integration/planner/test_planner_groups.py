"""The planner reads the lifecycle topic in a consumer group of its own (`app.py`): a replica's start is
fetched by a consumer that never holds request batches, on the real broker."""

from __future__ import annotations

from datetime import UTC, datetime

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.integration.planner_harness import poll_until, produce, replica_started, request
from warmplane.services.planner.app import lifecycle_group, running_planner
from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics

_TIMEOUT_S = 30.0


async def _committed(kafka: KafkaSettings, group: str, topic: str) -> int:
    """The sum of `group`'s offsets committed to the broker on `topic` (0: none)."""
    partitions = [TopicPartition(topic, p) for p in range(kafka.partitions)]
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(group, partitions=partitions)
    finally:
        await admin.close()
    return sum(max(0, committed[tp].offset) for tp in partitions if tp in committed)


async def test_starts_are_read_by_the_lifecycle_group_and_requests_by_the_planners(
    planner_settings: PlannerSettings,
) -> None:
    kafka, group = planner_settings.kafka, planner_settings.ingest.group_id
    topics = Topics(kafka.topic_prefix)
    await produce(kafka, [request([1, 2]), replica_started("r-a", datetime.now(UTC))])
    async with running_planner(planner_settings) as planner:

        async def both_ingested() -> bool:
            counted = planner.metrics.events_ingested
            return counted("request.observed") == 1 and counted("replica.started") == 1

        await poll_until(both_ingested, timeout_s=_TIMEOUT_S, what="the request and the start ingested")

        # The broker's offsets are committed after Postgres's, by the consumer that read the records.
        async def both_committed() -> bool:
            return (
                await _committed(kafka, lifecycle_group(group), topics.lifecycle) == 1
                and await _committed(kafka, group, topics.requests) == 1
            )

        await poll_until(both_committed, timeout_s=_TIMEOUT_S, what="each group's broker offsets")
    assert await _committed(kafka, group, topics.lifecycle) == 0
    assert await _committed(kafka, lifecycle_group(group), topics.requests) == 0
