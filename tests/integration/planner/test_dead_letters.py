"""Fuzzed and malformed events are each dead-lettered with a reason; the valid ones around them are counted.

The planner runs in-process on the real broker and Postgres. Every bad record is checked against the
codec before it is produced, so the test knows exactly which records must come back on the dead-letter
topic, with which reason, from which topic, partition and offset.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.golden_payloads import fuzzed_goldens, golden_payloads
from tests.integration.planner_harness import poll_until, request
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.codec import DecodeFailure, EventCodec
from warmplane.shared.events import Event, PrefixPayload
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import DeadLetterHeaders, Topics, partition_key

MAX_EVENT_BYTES = 4096
MAX_PAYLOAD_BYTES = 512
_TIMEOUT_S = 20.0
TOTAL_REQUESTS = "SELECT coalesce(sum(requests), 0) FROM prefix_requests"
Source = tuple[str, int, int]
"""(topic, partition, offset) of a produced record."""


@dataclass(frozen=True, slots=True)
class Bad:
    """A record the planner must dead-letter, and the reason it must give (any, when empty)."""

    topic: str
    value: bytes | None
    reason: str


def small_limits(settings: PlannerSettings) -> PlannerSettings:
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update={"max_event_bytes": MAX_EVENT_BYTES}),
            "ingest": settings.ingest.model_copy(update={"catalog_max_payload_bytes": MAX_PAYLOAD_BYTES}),
        }
    )


def bad_records(topics: Topics, codec: EventCodec) -> list[Bad]:
    """Every kind of bad record, spread over the three topics the planner consumes."""
    rng = random.Random(20261129)
    golden_request = json.loads(golden_payloads()["request.observed"])
    valid = codec.encode(request([1, 2]))
    oversized = codec.encode(request([1, 2], route="x" * 100)).replace(
        b"{", b'{"pad":"' + b"p" * 5000 + b'",', 1
    )
    raw: list[bytes | None] = [
        valid[: len(valid) // 2],
        valid[:-1],
        *(rng.randbytes(rng.randrange(1, 300)) for _ in range(10)),
        b"[1, 2, 3]",
        b'"request.observed"',
        b"42",
        b"null",
        b"{}",
        b'{"type": 5}',
        json.dumps({**golden_request, "type": "request.teleported"}).encode(),
        json.dumps({**golden_request, "schema_version": 2}).encode(),
        json.dumps({**golden_request, "occurred_at": "2026-11-29T12:00:00"}).encode(),
        json.dumps({**golden_request, "cached_tokens": 99_999}).encode(),
        oversized,
        *(data for data, _ in fuzzed_goldens(codec, rng, 40)),
    ]
    assert len(oversized) > MAX_EVENT_BYTES
    consumed = (topics.requests, topics.misses, topics.lifecycle)
    bad = []
    for index, value in enumerate(raw):
        failure = codec.decode(value)
        assert isinstance(failure, DecodeFailure), f"record {index} decodes: {failure!r}"
        bad.append(Bad(consumed[index % 3], value, failure.reason))
    big_payload = PrefixPayload(
        prefix_id=2, messages=[{"role": "user", "content": "w" * 2 * MAX_PAYLOAD_BYTES}]
    )
    too_big = codec.encode(request([1, 2], payload=big_payload))
    assert isinstance(codec.decode(too_big), Event)
    payload_bytes = len(msgspec.json.encode(big_payload))
    reason = f"payload of {payload_bytes} bytes exceeds catalog_max_payload_bytes={MAX_PAYLOAD_BYTES}"
    bad.append(Bad(topics.requests, too_big, reason))
    return bad


async def produce_records(
    kafka: KafkaSettings, records: Sequence[Event | Bad], codec: EventCodec
) -> list[Source]:
    """Publish events (keyed, on their topic) and bad records (unkeyed); where each one landed."""
    topics = Topics(kafka.topic_prefix)
    await ensure_topics(kafka, topics.all())
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", linger_ms=5)
    await asyncio.wait_for(producer.start(), _TIMEOUT_S)
    try:
        pending = []
        for record in records:
            if isinstance(record, Bad):
                # A tombstone needs a key (aiokafka refuses a record with neither).
                key = b"tombstone" if record.value is None else None
                pending.append(await producer.send(record.topic, value=record.value, key=key))
            else:
                value, key = codec.encode(record), partition_key(record)
                pending.append(await producer.send(topics.for_event(record), value=value, key=key))
        landed = await asyncio.wait_for(asyncio.gather(*pending), _TIMEOUT_S)
    finally:
        await producer.stop()
    return [(meta.topic, meta.partition, meta.offset) for meta in landed]


class DeadLetterReader:
    """Reads the whole dead-letter topic without a group, from the beginning, as it grows."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._kafka = kafka
        self._consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, enable_auto_commit=False)
        self.records: list[Any] = []

    async def __aenter__(self) -> DeadLetterReader:
        await asyncio.wait_for(self._consumer.start(), _TIMEOUT_S)
        topic = Topics(self._kafka.topic_prefix).dead_letter
        self._consumer.assign([TopicPartition(topic, p) for p in range(self._kafka.partitions)])
        await self._consumer.seek_to_beginning()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._consumer.stop()

    async def read_available(self) -> int:
        for batch in (await self._consumer.getmany(timeout_ms=100)).values():
            self.records.extend(batch)
        return len(self.records)


def dead_lettered_total(metrics: PlannerMetrics) -> float:
    [metric] = metrics.dead_lettered.collect()
    return sum(sample.value for sample in metric.samples if sample.name.endswith("_total"))


def dead_lettered_by_reason(metrics: PlannerMetrics) -> dict[str, float]:
    [metric] = metrics.dead_lettered.collect()
    return {s.labels["reason"]: s.value for s in metric.samples if s.name.endswith("_total")}


def fail_fast_on_planner_errors(caplog: pytest.LogCaptureFixture) -> None:
    """Raise at once if the planner or its consumer logged an error: waiting would only hide it."""
    for record in caplog.get_records("call"):
        if record.levelno >= logging.ERROR and record.name.startswith(("warmplane", "faststream")):
            raise AssertionError(f"{record.name} logged: {record.getMessage()} {record.exc_text or ''}")


async def test_bad_records_are_dead_lettered_and_valid_ones_counted(
    planner_settings: PlannerSettings, caplog: pytest.LogCaptureFixture
) -> None:
    settings = small_limits(planner_settings)
    topics = Topics(settings.kafka.topic_prefix)
    codec = EventCodec(MAX_EVENT_BYTES)
    bad = bad_records(topics, codec)
    rng = random.Random(7)
    before = [request([1, 10 + i % 5], tenant=("acme", "globex")[i % 2]) for i in range(80)]
    mixed: list[Event | Bad] = [*bad, *before[1:]]
    rng.shuffle(mixed)
    mixed = [before[0], *mixed, request([1, 99])]  # valid records first and last as well
    after = [request([3, 30 + i % 4]) for i in range(25)]
    valid_before = sum(1 for record in mixed if isinstance(record, Event))

    landed = dict(zip(await produce_records(settings.kafka, mixed, codec), mixed, strict=True))
    expected_letters = {source: record for source, record in landed.items() if isinstance(record, Bad)}
    assert len(expected_letters) == len(bad)

    db = await asyncpg.connect(settings.postgres.asyncpg_dsn(), timeout=_TIMEOUT_S)
    try:
        async with running_planner(settings) as planner, DeadLetterReader(settings.kafka) as letters:

            async def first_round_done() -> bool:
                fail_fast_on_planner_errors(caplog)
                arrived = await letters.read_available()
                return arrived >= len(bad) and await db.fetchval(TOTAL_REQUESTS) == valid_before

            await poll_until(first_round_done, timeout_s=_TIMEOUT_S, what="bad records dead-lettered")

            # The consumer keeps going after the bad records: later valid events are counted too.
            await produce_records(settings.kafka, after, codec)

            async def second_round_done() -> bool:
                fail_fast_on_planner_errors(caplog)
                return bool(await db.fetchval(TOTAL_REQUESTS) == valid_before + len(after))

            await poll_until(second_round_done, timeout_s=_TIMEOUT_S, what="later valid events counted")
            await letters.read_available()
            assert dead_lettered_total(planner.metrics) == len(bad)
            by_reason = dead_lettered_by_reason(planner.metrics)
            assert planner.metrics.duplicates._value.get() == 0
    finally:
        await db.close()
    assert_letters_match(letters.records, expected_letters, settings.ingest.group_id)
    assert by_reason["oversized"] == 1
    assert by_reason["oversized_payload"] == 1
    assert by_reason["future_schema"] >= 1 and by_reason["unknown_type"] >= 1
    assert by_reason["malformed"] >= 1 and by_reason["invalid"] >= 1


def _poison(**changes: Any) -> bytes:
    document = json.loads(golden_payloads()["request.observed"])
    document.update(changes)
    return json.dumps(document).encode()


# The style's rule: a poison message is dead-lettered and committed, and the consumer goes on.
@pytest.mark.parametrize(
    "value",
    [
        pytest.param(b'{"type": "request.observed"', id="control-truncated"),
        pytest.param(None, id="tombstone"),
        pytest.param(b'{"x":' + b"[" * 5_000 + b"]" * 5_000 + b"," + _poison()[1:], id="deep-nesting"),
        pytest.param(_poison(tenant="acme\u0000"), id="nul-in-tenant"),
        pytest.param(_poison(prompt_tokens=2**63), id="huge-token-count"),
        # Decodes, but jsonb refuses NUL: found by bisecting the failed batch, dead-lettered alone.
        pytest.param(
            _poison(payload={"prefix_id": 98765, "messages": [{"role": "user", "content": "a\u0000b"}]}),
            id="nul-in-payload",
        ),
    ],
)
async def test_a_poison_record_is_dead_lettered_not_fatal(
    planner_settings: PlannerSettings, caplog: pytest.LogCaptureFixture, value: bytes | None
) -> None:
    topics = Topics(planner_settings.kafka.topic_prefix)
    poison = Bad(topics.requests, value, reason="")
    marker = request([4, 40])
    sources = await produce_records(planner_settings.kafka, [poison, marker], EventCodec())
    db = await asyncpg.connect(planner_settings.postgres.asyncpg_dsn(), timeout=_TIMEOUT_S)
    try:
        async with running_planner(planner_settings), DeadLetterReader(planner_settings.kafka) as letters:

            async def done() -> bool:
                fail_fast_on_planner_errors(caplog)
                arrived = await letters.read_available()
                return arrived >= 1 and await db.fetchval(TOTAL_REQUESTS) == 1

            await poll_until(
                done, timeout_s=_TIMEOUT_S, what="the poison dead-lettered and the marker counted"
            )
    finally:
        await db.close()
    assert_letters_match(letters.records, {sources[0]: poison}, planner_settings.ingest.group_id)


def assert_letters_match(records: Sequence[Any], expected: dict[Source, Bad], group_id: str) -> None:
    """Exactly the bad records came back: original bytes, their reason, where they came from."""
    seen: dict[Source, Any] = {}
    for record in records:
        headers = {name: value.decode() for name, value in record.headers}
        source = (
            headers[DeadLetterHeaders.SOURCE_TOPIC],
            int(headers[DeadLetterHeaders.SOURCE_PARTITION]),
            int(headers[DeadLetterHeaders.SOURCE_OFFSET]),
        )
        assert source not in seen, f"dead-lettered twice: {source}"
        seen[source] = record
        assert source in expected, (
            f"a record that is not bad was dead-lettered: {source} {record.value!r:.200}"
        )
        reason = headers[DeadLetterHeaders.REASON]
        assert reason.strip() and "\n" not in reason
        assert reason == (expected[source].reason or reason)
        assert record.value == expected[source].value
        assert headers[DeadLetterHeaders.CONSUMER] == group_id
    assert seen.keys() == expected.keys()
