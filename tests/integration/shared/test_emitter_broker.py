"""The emitter on the real embedded broker: every event once, on Java's partition; and no broker, no block."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from warmplane.shared.codec import EventCodec
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.embedded.processes import free_port
from warmplane.shared.emitter import DropReason, Emitter
from warmplane.shared.emitter_kafka import java_partition
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import Event, ModelRef, ReplicaStarted, RequestObserved
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import EmitterSettings, KafkaSettings
from warmplane.shared.topics import Topics, partition_key

PARTITIONS = 4
CONSUME_DEADLINE_S = 30.0
# A correctness bound, not a performance one: emit() must return at once, on a noisy shared machine too.
MAX_EMIT_CALL_S = 0.050


def events(count: int) -> list[Event]:
    """Requests of 12 tenants with varied roots, and some lifecycle events: several keys and topics."""
    now = datetime.now(UTC)
    made: list[Event] = []
    for i in range(count):
        if i % 10 == 9:
            made.append(
                ReplicaStarted(
                    event_id=new_event_id(), occurred_at=now, producer="warmer", model=ModelRef("llama-3-8b"),
                    replica=f"replica-{i % 13}", node=f"node-{i % 3}",
                )
            )  # fmt: skip
        else:
            chain = [-(2**62) + i % 97, i, i + 1]
            made.append(
                RequestObserved(
                    event_id=new_event_id(), occurred_at=now, producer="vllm-0", tenant=f"tenant-{i % 12}",
                    model=ModelRef("llama-3-8b"), replica="replica-1", chain=chain, chain_tokens=[16, 32, 48],
                    prompt_tokens=50,
                )
            )  # fmt: skip
    return made


def kafka_for(bootstrap_servers: str, **overrides: int) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=bootstrap_servers,
        topic_prefix=f"emitter-{uuid.uuid4().hex[:8]}",
        partitions=PARTITIONS,
        **overrides,
    )


async def consume_all(
    bootstrap_servers: str, topics: list[str], expected: int
) -> list[tuple[str, int, bytes, bytes]]:
    """(topic, partition, key, value) of every record, read until `expected` arrived and a little longer.

    Tansu's ListOffsets reports the last batch's base offset + 1 as the end, so this counts records
    instead of trusting end offsets.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False)
    await asyncio.wait_for(consumer.start(), 10)
    try:
        consumer.assign([TopicPartition(topic, p) for topic in topics for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        records: list[tuple[str, int, bytes, bytes]] = []
        deadline = time.monotonic() + CONSUME_DEADLINE_S
        quiet_polls = 0
        while time.monotonic() < deadline and quiet_polls < 3:
            batches = await consumer.getmany(timeout_ms=200)
            got = [record for batch in batches.values() for record in batch]
            records += [(r.topic, r.partition, r.key, r.value) for r in got]
            # Past the expected count, a few empty polls show that nothing extra (a duplicate) follows.
            quiet_polls = quiet_polls + 1 if not got and len(records) >= expected else 0
        return records
    finally:
        await consumer.stop()


async def test_every_event_arrives_once_on_the_partition_its_key_maps_to(
    embedded_kafka: EmbeddedKafka,
) -> None:
    kafka = kafka_for(embedded_kafka.bootstrap_servers)
    topics = Topics(kafka.topic_prefix)
    await ensure_topics(kafka, topics.all())
    sent = events(20_000)
    settings = EmitterSettings(batch_max_events=500, close_timeout_s=30)
    async with Emitter(kafka, settings, topics) as emitter:
        for i, event in enumerate(sent):
            assert emitter.emit(event)
            if i % 100 == 0:
                await asyncio.sleep(0)  # as request handlers would: the sender runs meanwhile
    assert emitter.stats.sent == len(sent)
    assert emitter.stats.dropped_total == 0 and emitter.stats.buffered == 0

    records = await consume_all(kafka.bootstrap_servers, [topics.requests, topics.lifecycle], len(sent))
    codec = EventCodec()
    received: dict[uuid.UUID, Event] = {}
    for topic, partition, key, value in records:
        decoded = codec.decode(value)
        assert isinstance(decoded, Event), decoded
        assert decoded.event_id not in received, f"{decoded.event_id} arrived twice"
        received[decoded.event_id] = decoded
        assert topic == topics.for_event(decoded)
        assert key == partition_key(decoded)
        assert partition == java_partition(key, PARTITIONS)
    assert received == {event.event_id: event for event in sent}


async def test_with_no_broker_emit_never_blocks_and_every_drop_is_counted() -> None:
    kafka = kafka_for(f"127.0.0.1:{free_port()}", request_timeout_ms=1_000)  # nothing listens there
    settings = EmitterSettings(
        buffer_max_events=1_000, batch_max_events=100, connect_timeout_s=1, retry_backoff_max_s=0.2,
        close_timeout_s=2,
    )  # fmt: skip
    emitter = Emitter(kafka, settings, Topics(kafka.topic_prefix))
    await emitter.start()
    attempts, slowest, accepted = 5_000, 0.0, 0
    for i, event in enumerate(events(attempts)):
        began = time.perf_counter()
        accepted += emitter.emit(event)
        slowest = max(slowest, time.perf_counter() - began)
        if i % 50 == 0:
            await asyncio.sleep(0.001)  # let the sender try (and fail) to connect meanwhile
    assert slowest < MAX_EMIT_CALL_S
    stats = emitter.stats
    assert not stats.connected
    assert accepted == stats.emitted == settings.buffer_max_events
    assert stats.dropped[DropReason.BUFFER_FULL] == attempts - settings.buffer_max_events
    assert stats.emitted + stats.rejected == attempts

    began = time.monotonic()
    await emitter.close()
    assert time.monotonic() - began < settings.close_timeout_s + 0.5
    stats = emitter.stats
    assert stats.sent == 0 and stats.buffered == 0
    assert stats.dropped[DropReason.SHUTDOWN] == settings.buffer_max_events
    assert stats.emitted + stats.rejected == attempts


async def test_a_broker_killed_under_load_blocks_nobody_and_loses_only_counted_events(tmp_path: Path) -> None:
    with EmbeddedKafka(tmp_path / "kafka") as broker:  # its own broker: this test kills it
        kafka = kafka_for(broker.bootstrap_servers, request_timeout_ms=1_000)
        topics = Topics(kafka.topic_prefix)
        await ensure_topics(kafka, topics.all())
        settings = EmitterSettings(
            buffer_max_events=5_000, batch_max_events=200, send_retries=1, retry_backoff_min_s=0.05,
            retry_backoff_max_s=0.2, close_timeout_s=3,
        )  # fmt: skip
        emitter = Emitter(kafka, settings, topics)
        await emitter.start()
        attempts, slowest = 20_000, 0.0
        for i, event in enumerate(events(attempts)):
            if i == attempts // 4:
                await _until(lambda: emitter.stats.sent > 0, "some events to be acknowledged")
                broker.kill()
            began = time.perf_counter()
            emitter.emit(event)
            slowest = max(slowest, time.perf_counter() - began)
            if i % 50 == 0:
                await asyncio.sleep(0.001)
        assert slowest < MAX_EMIT_CALL_S
        began = time.monotonic()
        await emitter.close()
        assert time.monotonic() - began < settings.close_timeout_s + 0.5
    stats = emitter.stats
    assert stats.sent > 0
    assert stats.dropped[DropReason.BUFFER_FULL] > 0  # the buffer filled while nobody drained it
    assert stats.buffered == 0
    assert stats.emitted + stats.rejected == attempts
    assert stats.sent + stats.lost == stats.emitted


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
