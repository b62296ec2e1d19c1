"""Consumer lag from the services' own consumers, on the real broker: it rises while a consumer is behind
and returns to 0 once it has caught up; the planner and the warmer export it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import asyncpg
import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.planner_harness import poll_until, produce, request
from warmplane.services.planner.app import planner_topics, running_planner
from warmplane.services.planner.settings import PlannerSettings
from warmplane.services.warmer.service import Warmer
from warmplane.services.warmer.settings import EngineSettings, WarmerSettings
from warmplane.shared.consumer_lag import report_lag_forever
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics

_TIMEOUT_S = 30.0


def _lag(gauge: Gauge) -> dict[tuple[str, str], float]:
    return {
        (sample.labels["topic"], sample.labels["partition"]): sample.value
        for metric in gauge.collect()
        for sample in metric.samples
    }


async def test_the_gauge_rises_while_a_consumer_is_behind_and_returns_to_zero(
    embedded_kafka: EmbeddedKafka,
) -> None:
    kafka = KafkaSettings(bootstrap_servers=embedded_kafka.bootstrap_servers, partitions=2)
    topic = f"lag-{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka, [topic])
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka.bootstrap_servers,
        group_id=f"lag-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=2_000,
        heartbeat_interval_ms=500,
    )
    await consumer.start()
    gauge = Gauge("lag", "lag", ["topic", "partition"], registry=CollectorRegistry())
    reporter = asyncio.create_task(
        report_lag_forever([lambda: consumer], gauge, interval_s=0.05, timeout_s=5)
    )
    try:

        async def reported(expected: dict[tuple[str, str], float]) -> bool:
            return _lag(gauge) == expected

        await poll_until(
            lambda: reported({(topic, "0"): 0, (topic, "1"): 0}), timeout_s=_TIMEOUT_S, what="lag 0, unread"
        )
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
        await producer.start()
        try:
            async with asyncio.timeout(_TIMEOUT_S):
                sent = [await producer.send(topic, b"x", partition=i % 2) for i in range(50)]
                await asyncio.gather(*sent)
        finally:
            await producer.stop()
        # The consumer reads nothing: its lag is everything published.
        await poll_until(
            lambda: reported({(topic, "0"): 25, (topic, "1"): 25}), timeout_s=_TIMEOUT_S, what="lag 25 each"
        )
        read = 0
        while read < 50:
            batches = await asyncio.wait_for(consumer.getmany(timeout_ms=500), _TIMEOUT_S)
            read += sum(len(records) for records in batches.values())
        await poll_until(
            lambda: reported({(topic, "0"): 0, (topic, "1"): 0}), timeout_s=_TIMEOUT_S, what="caught up"
        )
    finally:
        reporter.cancel()
        await asyncio.gather(reporter, return_exceptions=True)
        await consumer.stop()


async def test_a_planner_held_up_by_postgres_reports_its_lag_until_it_catches_up(
    planner_settings: PlannerSettings, migrated_database: str
) -> None:
    settings = planner_settings.model_copy(
        update={
            "kafka": planner_settings.kafka.model_copy(update={"lag_interval_s": 0.1}),
            "ingest": planner_settings.ingest.model_copy(
                update={"batch_max_records": 20, "writer_queue_depth": 1}
            ),
        }
    )
    async with running_planner(settings) as planner:
        metrics = planner.metrics

        async def ingested(count: int) -> bool:
            return metrics.events_ingested() == count

        async def behind(at_least: float) -> bool:
            return sum(_lag(metrics.consumer_lag).values()) >= at_least

        every_partition = {
            (topic, str(partition))
            for topic in planner_topics(Topics(settings.kafka.topic_prefix))
            for partition in range(settings.kafka.partitions)
        }

        async def caught_up() -> bool:
            lag = _lag(metrics.consumer_lag)
            return set(lag) == every_partition and not any(lag.values())

        await produce(settings.kafka, [request([1, 2])])
        await poll_until(lambda: ingested(1), timeout_s=_TIMEOUT_S, what="the planner's first event")
        blocker = await asyncpg.connect(migrated_database)
        try:
            # The writer's batch function updates ingest_offsets: held here, the planner stops reading.
            held = blocker.transaction()
            await held.start()
            await blocker.execute("LOCK TABLE ingest_offsets IN EXCLUSIVE MODE")
            await produce(settings.kafka, [request([1, 2 + i]) for i in range(300)])
            await poll_until(lambda: behind(150), timeout_s=_TIMEOUT_S, what="lag of 150 events or more")
            assert metrics.events_ingested() == 1
            await held.rollback()
        finally:
            await blocker.close()
        await poll_until(lambda: ingested(301), timeout_s=_TIMEOUT_S, what="all 301 events ingested")
        await poll_until(caught_up, timeout_s=_TIMEOUT_S, what="lag 0 on every partition")


def _scraped(text: str, name: str) -> Iterator[tuple[dict[str, str], float]]:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                yield sample.labels, sample.value


async def test_the_warmer_exports_its_plans_lag_and_zero_failures_for_each_replica(
    embedded_kafka: EmbeddedKafka,
) -> None:
    kafka = KafkaSettings(
        bootstrap_servers=embedded_kafka.bootstrap_servers,
        topic_prefix=f"t{uuid.uuid4().hex[:8]}",
        partitions=2,
        session_timeout_ms=2_000,
        heartbeat_interval_ms=500,
        lag_interval_s=0.1,
    )
    settings = WarmerSettings(
        kafka=kafka,
        node="node-lag",
        # Nothing answers there: the replica stays starting, which is all this test needs.
        engines=[EngineSettings(replica="vllm-lag", url="http://127.0.0.1:9", served_model="m")],
        http_host="127.0.0.1",
        http_port=0,
    )
    plans = Topics(kafka.topic_prefix).plans
    async with Warmer(settings) as warmer, httpx.AsyncClient(timeout=5) as http:

        async def metrics_text() -> str:
            response = await http.get(f"http://127.0.0.1:{warmer.http_port}/metrics")
            assert response.status_code == 200
            return response.text

        # Undecodable plans are dead-lettered and committed past: read, so not lag.
        await produce(kafka, [(plans, b"not a plan") for _ in range(4)])

        async def read_all() -> bool:
            text = await metrics_text()
            lag = {
                (labels["topic"], labels["partition"]): value
                for labels, value in _scraped(text, "warmplane_warmer_consumer_lag")
            }
            dead = sum(value for _, value in _scraped(text, "warmplane_warmer_dead_lettered_total"))
            return dead == 4 and lag == {(plans, "0"): 0, (plans, "1"): 0}

        await poll_until(read_all, timeout_s=_TIMEOUT_S, what="4 plans read and lag 0 on both partitions")
        failed = dict(
            (labels["replica"], value)
            for labels, value in _scraped(await metrics_text(), "warmplane_warmer_items_total")
            if labels["state"] == "failed"
        )
        assert failed == {"vllm-lag": 0}
