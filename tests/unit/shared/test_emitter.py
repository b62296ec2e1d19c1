"""The emitter against an in-memory producer: bounded, never raising, exact accounts, Java partitions."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from aiokafka import codec as aiokafka_codec
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from warmplane.shared.codec import EventCodec
from warmplane.shared.emitter import DropReason, Emitter
from warmplane.shared.emitter_batches import Flight, split_into_batches
from warmplane.shared.emitter_kafka import KeyHashCache, ProducerConfig, java_partition, murmur2
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    Event,
    ModelRef,
    PrefixPayload,
    ReplicaCrashed,
    ReplicaStarted,
    RequestObserved,
)
from warmplane.shared.settings import EmitterSettings, KafkaSettings
from warmplane.shared.topics import Topics, partition_key

TOPICS = Topics("unit")
FAST = EmitterSettings(
    linger_ms=0, retry_backoff_min_s=0.001, retry_backoff_max_s=0.005, connect_timeout_s=1, close_timeout_s=5
)
KAFKA = KafkaSettings()
DEADLINE_S = 5.0


class FakeBatch:
    """A record batch that holds at most `capacity` records."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.records: list[tuple[bytes | None, bytes | None]] = []

    def append(self, *, timestamp: int | None, key: bytes | None, value: bytes | None) -> object | None:
        if len(self.records) >= self.capacity:
            return None
        self.records.append((key, value))
        return object()

    def record_count(self) -> int:
        return len(self.records)


class FakeProducer:
    """An in-memory `BatchProducer`. Deliveries resolve at once, unless the first `fail_sends` fail, or
    all are held (`hold`) until the test resolves them or `fail_pending()` fails them."""

    def __init__(
        self,
        partitions: int = 4,
        *,
        fail_sends: int = 0,
        start_failures: int = 0,
        batch_capacity: int = 10**9,
    ) -> None:
        self.partitions = partitions
        self.fail_sends = fail_sends
        self.start_failures = start_failures
        self.batch_capacity = batch_capacity
        self.hold = False
        self.held: list[asyncio.Future[Any]] = []
        self.configs: list[ProducerConfig] = []
        self.start_calls = self.stop_calls = self.send_calls = 0
        self.delivered: list[tuple[str, int, list[tuple[bytes | None, bytes | None]]]] = []

    def factory(self, config: ProducerConfig) -> FakeProducer:
        self.configs.append(config)
        return self

    async def start(self) -> None:
        self.start_calls += 1
        if self.start_failures:
            self.start_failures -= 1
            raise KafkaConnectionError("no broker here")

    async def stop(self) -> None:
        self.stop_calls += 1

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.partitions))

    def create_batch(self) -> FakeBatch:
        return FakeBatch(self.batch_capacity)

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future[Any]:
        self.send_calls += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.fail_sends:
            self.fail_sends -= 1
            future.set_exception(KafkaTimeoutError())
        elif self.hold:
            self.held.append(future)
        else:
            self.delivered.append((topic, partition, batch.records))
            future.set_result(None)
        return future

    def fail_pending(self) -> None:
        for future in self.held:
            if not future.done():
                future.set_exception(KafkaConnectionError("stopped"))

    def values(self) -> list[bytes | None]:
        return [value for _, _, records in self.delivered for _, value in records]


def request(i: int = 0, *, tenant: str = "t1", payload: PrefixPayload | None = None) -> RequestObserved:
    chain = [1_000 + i % 50, 2_000 + i, 3_000 + i]
    return RequestObserved(
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="vllm-0",
        tenant=tenant,
        model=ModelRef("llama-3-8b"),
        replica="r1",
        chain=chain,
        chain_tokens=[10, 20, 30],
        prompt_tokens=40,
        payload=payload,
    )


def replica_started(i: int) -> ReplicaStarted:
    return ReplicaStarted(
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="warmer",
        model=ModelRef("m"),
        replica=f"r{i}",
        node="n1",
    )


def make_emitter(fake: FakeProducer, settings: EmitterSettings = FAST, **kwargs: Any) -> Emitter:
    return Emitter(kwargs.pop("kafka", KAFKA), settings, TOPICS, producer_factory=fake.factory, **kwargs)


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


def decode_all(values: list[bytes | None]) -> list[Event]:
    decoded = [EventCodec().decode(value) for value in values]
    assert all(isinstance(event, Event) for event in decoded), decoded
    return [event for event in decoded if isinstance(event, Event)]


def assert_accounts(emitter: Emitter, attempts: int) -> None:
    stats = emitter.stats
    assert stats.emitted + stats.rejected == attempts
    assert stats.sent + stats.lost + stats.buffered == stats.emitted


# --- partitioning ---

# Kafka's own test vectors for Utils.murmur2 (clients/src/test/.../UtilsTest.java), as signed Java ints.
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}
# Partitions of 1000 the Java client picks (the vectors kafka-python checked against it).
JAVA_PARTITION_OF_1000 = {b"": 681, b"a": 524, b"ab": 434, b"abc": 107, b"123456789": 566, b"\x00 ": 742}


@pytest.mark.parametrize(("key", "expected"), JAVA_MURMUR2.items())
def test_murmur2_matches_the_java_client(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected & 0xFFFFFFFF


@pytest.mark.parametrize(("key", "expected"), JAVA_PARTITION_OF_1000.items())
def test_partition_of_a_key_matches_the_java_default_partitioner(key: bytes, expected: int) -> None:
    assert java_partition(key, 1000) == expected


@given(st.binary(max_size=200), st.integers(min_value=1, max_value=64))
def test_partition_agrees_with_aiokafka_default_partitioner(key: bytes, partitions: int) -> None:
    every = list(range(partitions))
    assert java_partition(key, partitions) == DefaultPartitioner()(key, every, every)


def test_key_hash_cache_is_bounded_and_agrees_with_murmur2() -> None:
    cache = KeyHashCache(max_entries=8)
    keys = [f"tenant/model/{i}".encode() for i in range(50)]
    for key in keys:
        assert cache.compute(key) == murmur2(key) & 0x7FFFFFFF
        assert cache.get(key) == murmur2(key) & 0x7FFFFFFF
    assert sum(cache.get(key) is not None for key in keys) <= 8


async def test_each_event_lands_on_the_partition_java_would_pick_and_decodes() -> None:
    fake = FakeProducer(partitions=6)
    events: list[Event] = [request(i, tenant=f"t{i % 7}") for i in range(300)]
    events += [replica_started(i) for i in range(40)]
    async with make_emitter(fake) as emitter:
        assert all(emitter.emit(event) for event in events)
    codec = EventCodec()
    seen = {}
    for topic, partition, records in fake.delivered:
        for key, value in records:
            assert key is not None
            assert partition == java_partition(key, 6)
            decoded = codec.decode(value)
            assert isinstance(decoded, Event)
            assert topic == TOPICS.for_event(decoded) and key == partition_key(decoded)
            seen[decoded.event_id] = decoded
    assert set(seen) == {event.event_id for event in events}


async def test_order_of_one_key_is_kept() -> None:
    fake = FakeProducer(partitions=3)
    events = [request(0) for _ in range(500)]  # one key: one partition, in emit order
    async with make_emitter(fake, EmitterSettings(batch_max_events=64, linger_ms=0)) as emitter:
        for event in events:
            emitter.emit(event)
            if random.random() < 0.1:
                await asyncio.sleep(0)
    assert [event.event_id for event in decode_all(fake.values())] == [event.event_id for event in events]


@given(
    st.lists(st.binary(min_size=1, max_size=12), min_size=1, max_size=300),
    st.integers(min_value=1, max_value=9),
    st.integers(min_value=1, max_value=40),
)
def test_split_puts_every_event_in_one_batch_in_order_on_its_partition(
    keys: list[bytes], partitions: int, capacity: int
) -> None:
    values = [f"{i}".encode() for i in range(len(keys))]
    group = Flight("topic", attempt=2, keys=list(keys), values=values)
    producer = FakeProducer(partitions, batch_capacity=capacity)
    flights = split_into_batches(
        producer, group, list(range(partitions)), KeyHashCache(16), 1_700_000_000_000
    )
    seen: list[bytes] = []
    for flight in flights:
        assert flight.attempt == 2 and flight.keys and len(flight.keys) <= capacity
        assert isinstance(flight.batch, FakeBatch) and flight.batch.records == list(
            zip(flight.keys, flight.values, strict=True)
        )
        assert all(java_partition(key, partitions) == flight.partition for key in flight.keys)
        seen += flight.values
    assert sorted(seen, key=int) == values
    for partition in range(partitions):  # within a partition, emit order is kept
        order = [int(v) for f in flights if f.partition == partition for v in f.values]
        assert order == sorted(order)


# --- bounds and drops ---


async def test_a_full_buffer_refuses_and_counts_without_blocking() -> None:
    fake = FakeProducer()
    emitter = make_emitter(fake, EmitterSettings(buffer_max_events=10, batch_max_events=5))
    results = [emitter.emit(request(i)) for i in range(15)]  # not started: nothing drains
    assert results == [True] * 10 + [False] * 5
    assert emitter.stats.dropped[DropReason.BUFFER_FULL] == 5
    assert emitter.stats.buffered == 10
    assert_accounts(emitter, 15)
    await emitter.close()
    assert emitter.stats.dropped[DropReason.SHUTDOWN] == 10
    assert_accounts(emitter, 15)


async def test_the_buffer_is_bounded_in_bytes_too() -> None:
    size = len(EventCodec().encode(request(0)))
    emitter = make_emitter(FakeProducer(), EmitterSettings(buffer_max_bytes=size * 3 + size // 2))
    assert [emitter.emit(request(i)) for i in range(5)] == [True, True, True, False, False]
    assert emitter.stats.dropped[DropReason.BUFFER_FULL] == 2
    await emitter.close()


async def test_an_unencodable_event_is_counted_not_raised() -> None:
    emitter = make_emitter(FakeProducer())
    broken = RequestObserved(  # msgspec does not validate on construction: this one cannot be encoded
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="p",
        tenant="t",
        model=ModelRef("m"),
        replica="r",
        chain=[object()],  # type: ignore[list-item]
        chain_tokens=[1],
        prompt_tokens=1,
    )
    keyless = RequestObserved(  # an empty chain has no root prefix to key by
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="p",
        tenant="t",
        model=ModelRef("m"),
        replica="r",
        chain=[],
        chain_tokens=[],
        prompt_tokens=1,
    )
    assert emitter.emit(broken) is False
    assert emitter.emit(keyless) is False
    assert emitter.emit(request(1)) is True
    assert emitter.stats.dropped[DropReason.ENCODE_ERROR] == 2
    assert_accounts(emitter, 3)
    await emitter.close()


async def test_an_event_larger_than_the_codec_allows_is_counted_not_raised() -> None:
    fake = FakeProducer()
    crashed = ReplicaCrashed(  # `reason` is capped at 2048 by the schema, but nothing checks on construction
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="warmer",
        model=ModelRef("m"),
        replica="r1",
        node="n1",
        reason="x" * (300 * 1024),
    )
    assert len(crashed.reason) > EventCodec().max_event_bytes
    async with make_emitter(fake) as emitter:
        assert emitter.emit(crashed) is False
        assert emitter.emit(replica_started(1)) is True
    assert emitter.stats.dropped[DropReason.TOO_LARGE] == 1
    assert emitter.stats.sent == 1
    assert_accounts(emitter, 2)


async def test_an_oversized_payload_is_stripped_and_the_event_still_sent() -> None:
    fake = FakeProducer()
    small = request(1, payload=PrefixPayload(prefix_id=1_001, prompt="hello"))
    large = request(2, payload=PrefixPayload(prefix_id=1_002, prompt="x" * 70_000))
    huge = request(3, payload=PrefixPayload(prefix_id=1_003, prompt="x" * 400_000))  # > max_event_bytes
    async with make_emitter(fake) as emitter:
        assert all(emitter.emit(event) for event in (small, large, huge))
    decoded = {event.event_id: event for event in decode_all(fake.values())}
    assert decoded[small.event_id] == small
    assert decoded[large.event_id] == msgspec.structs.replace(large, payload=None)
    assert decoded[huge.event_id] == msgspec.structs.replace(huge, payload=None)
    assert emitter.stats.payloads_stripped == 2
    assert emitter.stats.sent == 3


async def test_emit_after_close_is_refused_and_start_after_close_raises() -> None:
    emitter = make_emitter(FakeProducer())
    await emitter.close()
    await emitter.close()  # idempotent
    assert emitter.emit(request(1)) is False
    assert emitter.stats.dropped[DropReason.CLOSED] == 1
    with pytest.raises(RuntimeError):
        await emitter.start()


# --- delivery, retries, shutdown ---


async def test_close_flushes_everything_buffered_before_start() -> None:
    fake = FakeProducer(partitions=3)
    emitter = make_emitter(fake, EmitterSettings(batch_max_events=100, linger_ms=50))
    events: list[Event] = [request(i) for i in range(2_500)] + [replica_started(i) for i in range(500)]
    assert all(emitter.emit(event) for event in events)
    await emitter.start()
    await emitter.close()
    assert emitter.stats.sent == 3_000 and emitter.stats.buffered == 0 and emitter.stats.dropped_total == 0
    assert len(fake.values()) == 3_000
    assert all(len(records) <= 100 for _, _, records in fake.delivered)
    assert fake.stop_calls == 1
    assert not emitter.stats.connected


async def test_a_lone_event_lingers_before_it_is_sent() -> None:
    fake = FakeProducer()
    async with make_emitter(fake, FAST.model_copy(update={"linger_ms": 200})) as emitter:
        await wait_until(lambda: emitter.stats.connected, "the emitter to connect")
        emitter.emit(request(1))
        await asyncio.sleep(0.05)
        assert emitter.stats.sent == 0  # still waiting for companions
        await wait_until(lambda: emitter.stats.sent == 1, "the lingering event to be sent")


async def test_a_batch_full_in_bytes_continues_in_a_new_one() -> None:
    fake = FakeProducer(partitions=1, batch_capacity=7)
    async with make_emitter(fake) as emitter:
        for i in range(50):
            emitter.emit(request(i))
    assert emitter.stats.sent == 50
    assert all(len(records) <= 7 for _, _, records in fake.delivered)


async def test_failed_sends_are_retried_then_delivered() -> None:
    fake = FakeProducer(fail_sends=2)
    async with make_emitter(fake, FAST.model_copy(update={"send_retries": 3})) as emitter:
        emitter.emit(request(1))
        await wait_until(lambda: emitter.stats.sent == 1, "the retried event to be sent")
    assert fake.send_calls == 3
    assert emitter.stats.dropped_total == 0


async def test_a_batch_that_keeps_failing_is_dropped_after_bounded_retries() -> None:
    fake = FakeProducer(partitions=1, fail_sends=10**9)
    emitter = make_emitter(fake, FAST.model_copy(update={"send_retries": 2}))
    await emitter.start()
    for i in range(20):
        emitter.emit(request(i))
    await wait_until(
        lambda: emitter.stats.dropped[DropReason.SEND_FAILED] == 20, "the failed batch to be dropped"
    )
    assert fake.send_calls == 3  # one batch: the first attempt and two retries
    assert emitter.stats.buffered == 0
    assert emitter.emit(request(99)) is True  # the emitter goes on
    await emitter.close(timeout_s=0.5)
    assert_accounts(emitter, 21)


async def test_start_never_raises_when_the_broker_is_down_and_reconnects() -> None:
    fake = FakeProducer(start_failures=3)
    emitter = make_emitter(fake)
    await emitter.start()
    assert emitter.emit(request(1)) is True
    await wait_until(lambda: emitter.stats.sent == 1, "the emitter to connect and send")
    assert fake.start_calls == 4
    assert fake.stop_calls == 3  # each failed attempt's producer was stopped
    await emitter.close()


async def test_close_returns_in_time_when_the_broker_never_answers() -> None:
    fake = FakeProducer(start_failures=10**9)
    emitter = make_emitter(fake)
    await emitter.start()
    for i in range(100):
        emitter.emit(request(i))
    began = time.monotonic()
    await emitter.close(timeout_s=0.5)
    assert time.monotonic() - began < 1.0
    assert emitter.stats.dropped[DropReason.SHUTDOWN] == 100
    assert_accounts(emitter, 100)


async def test_close_gives_up_on_unacknowledged_batches_at_its_deadline() -> None:
    fake = FakeProducer()
    fake.hold = True
    emitter = make_emitter(fake)
    await emitter.start()
    for i in range(200):
        emitter.emit(request(i))
    await wait_until(lambda: bool(fake.held), "a batch to be handed to the producer")
    began = time.monotonic()
    await emitter.close(timeout_s=0.3)
    assert time.monotonic() - began < 0.8
    stats = emitter.stats
    assert stats.sent == 0 and stats.buffered == 0
    assert stats.dropped[DropReason.SHUTDOWN] == 200
    assert_accounts(emitter, 200)


async def test_producer_config_follows_settings() -> None:
    fake = FakeProducer()
    settings = EmitterSettings(acks="1", client_id="vllm-7", batch_max_bytes=65_536, connections=3)
    emitter = make_emitter(
        fake, settings, kafka=KafkaSettings(bootstrap_servers="k:9092", request_timeout_ms=1234)
    )
    await emitter.start()
    await wait_until(lambda: emitter.stats.connected, "the emitter to connect")
    await emitter.close()
    config = fake.configs[0]
    assert (config.bootstrap_servers, config.client_id, config.acks) == ("k:9092", "vllm-7", 1)
    assert (config.request_timeout_ms, config.max_batch_bytes, config.connections) == (1234, 65_536, 3)


def test_unavailable_compression_is_refused_at_construction() -> None:
    if aiokafka_codec.has_lz4():
        pytest.skip("lz4 is installed here")
    with pytest.raises(ValueError, match="lz4"):
        Emitter(KAFKA, EmitterSettings(compression="lz4"), TOPICS)


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="retry_backoff_min_s"):
        EmitterSettings(retry_backoff_min_s=2, retry_backoff_max_s=1)
    with pytest.raises(ValueError, match="batch_max_events"):
        EmitterSettings(buffer_max_events=10, batch_max_events=20)


async def test_metrics_read_the_counters_and_leave_the_registry_on_close() -> None:
    registry = CollectorRegistry()
    emitter = make_emitter(
        FakeProducer(), EmitterSettings(buffer_max_events=2, batch_max_events=1), metrics_registry=registry
    )
    for i in range(3):
        emitter.emit(request(i))
    assert registry.get_sample_value("warmplane_emitter_events_emitted_total") == 2
    assert registry.get_sample_value("warmplane_emitter_events_dropped_total", {"reason": "buffer_full"}) == 1
    assert registry.get_sample_value("warmplane_emitter_buffered_events") == 2
    await emitter.close()
    assert registry.get_sample_value("warmplane_emitter_events_emitted_total") is None
