"""The event contract through a real broker: golden events arrive equal, on their topic and partition."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.partitioner import DefaultPartitioner, murmur2

from tests.golden_payloads import golden_payloads
from warmplane.shared.codec import EventCodec
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.events import Event
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics, partition_key

PARTITIONS = 4
_TIMEOUT_S = 20.0


@pytest.mark.parametrize(
    ("key", "java_hash"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_the_partitioner_hashes_keys_as_the_java_client_does(key: bytes, java_hash: int) -> None:
    """Vectors from Apache Kafka's UtilsTest.testMurmur2: other clients place our keys alike."""
    assert murmur2(key) % 2**32 == java_hash % 2**32


async def consume_all(
    settings: KafkaSettings, topics: set[str], count: int, timeout_s: float
) -> list[ConsumerRecord]:
    """The first `count` records of `topics`, read without a group (assigned, from the beginning)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False, request_timeout_ms=10_000
    )
    await asyncio.wait_for(consumer.start(), timeout_s)
    try:
        consumer.assign([TopicPartition(topic, p) for topic in topics for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout_s
        while len(records) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out with {len(records)} of {count} records consumed")
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                records.extend(batch)
        return records
    finally:
        await consumer.stop()


async def test_golden_events_cross_the_broker_intact(embedded_kafka: EmbeddedKafka) -> None:
    settings = KafkaSettings(
        bootstrap_servers=embedded_kafka.bootstrap_servers,
        topic_prefix=f"contract-{uuid.uuid4().hex[:8]}",
        partitions=PARTITIONS,
    )
    topics = Topics(settings.topic_prefix)
    await ensure_topics(settings, topics.all())
    codec = EventCodec(settings.max_event_bytes)
    events: list[Event] = []
    for data in golden_payloads().values():
        event = codec.decode(data)
        assert isinstance(event, Event)
        events.append(event)
    partitioner = DefaultPartitioner()
    expected = {
        event.event_id: (
            event,
            topics.for_event(event),
            partition_key(event),
            partitioner(partition_key(event), list(range(PARTITIONS)), list(range(PARTITIONS))),
        )
        for event in events
    }
    assert len(expected) == len(events), "golden event ids must be distinct"
    assert len({partition for *_, partition in expected.values()}) > 1, "keys should spread over partitions"

    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all")
    await asyncio.wait_for(producer.start(), _TIMEOUT_S)
    try:
        sent = [
            await producer.send(topic, value=codec.encode(event), key=key)
            for event, topic, key, _ in expected.values()
        ]
        metadata = await asyncio.wait_for(asyncio.gather(*sent), _TIMEOUT_S)
    finally:
        await producer.stop()
    for (_, topic, _, partition), record in zip(expected.values(), metadata, strict=True):
        assert (record.topic, record.partition) == (topic, partition)

    used_topics = {topic for _, topic, _, _ in expected.values()}
    assert used_topics == {
        topics.requests,
        topics.misses,
        topics.lifecycle,
        topics.heartbeats,
        topics.plans,
        topics.warm_results,
    }
    records = await consume_all(settings, used_topics, len(events), _TIMEOUT_S)

    assert len(records) == len(events)
    for record in records:
        decoded = codec.decode(record.value)
        assert isinstance(decoded, Event), decoded
        event, topic, key, partition = expected[decoded.event_id]
        assert decoded == event
        assert (record.topic, record.partition, record.key) == (topic, partition, key)
