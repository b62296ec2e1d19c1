"""Reading the request topic from its beginning to its end as it was at the start, without a consumer group
(nothing is committed, no planner's offsets move): the recorded traffic `warmplane evaluate-traffic`
exports. The thin Kafka adapter of `own_trace`, which does the rest without I/O.

Requests come back in (partition, offset) order, so that an export is a function of the topic's content:
the order in which partitions' fetches arrive is not, and events of the same instant on different
partitions keep this order through `own_trace.select`'s stable sort.

The end is each partition's end offset when the read starts; events that arrive meanwhile may be read
too when they share a fetched batch (Tansu, the embedded broker, answers the end offset with the last
batch's base offset + 1, so the read goes on to the end of that batch: see `shared/consumer_lag.py`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from warmplane.shared.codec import DecodeFailure, EventCodec
from warmplane.shared.events import RequestObserved
from warmplane.shared.kafka_clients import client_security
from warmplane.shared.settings import KafkaSettings

_FETCH_MS = 200


@dataclass
class RequestLog:
    """What the read found: the request events kept, records skipped by key (other tenants or models),
    records that did not decode and events of other types (counted, never fatal: a poison message must
    not stop an export)."""

    requests: list[RequestObserved] = field(default_factory=list)
    records: int = 0
    skipped_by_key: int = 0
    undecodable: int = 0
    other_events: int = 0


async def read_requests(
    kafka: KafkaSettings, topic: str, *, key_prefix: bytes = b"", deadline_s: float = 300.0
) -> RequestLog:
    """Every request event of `topic` up to its end offsets at the start, those whose record key does not
    start with `key_prefix` skipped undecoded (request keys are `tenant/model/root`, so a prefix of
    `tenant/model/` keeps a superset of one tenant's and model's requests: the caller filters exactly).

    Raises `LookupError` when the topic does not exist, `TimeoutError` when the broker does not answer or
    the end is not reached within `deadline_s` (saying how far the read got).
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap_servers,
        **client_security(kafka.security),
        client_id=f"{kafka.client_id}-evaluate-traffic",
        enable_auto_commit=False,
        request_timeout_ms=kafka.request_timeout_ms,
        max_partition_fetch_bytes=max(kafka.max_event_bytes, 1 << 20),
    )
    log = RequestLog()
    try:
        async with asyncio.timeout(deadline_s):
            await consumer.start()
            partitions = await _partitions(consumer, topic)
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            ends: dict[TopicPartition, int] = await consumer.end_offsets(partitions)
            await _read_to(consumer, ends, key_prefix, EventCodec(kafka.max_event_bytes), log)
    except TimeoutError:
        raise TimeoutError(
            f"{topic}: {log.records:,} records read in {deadline_s:g} s, short of the end (or the"
            f" broker at {kafka.bootstrap_servers} did not answer); a longer deadline reads on"
        ) from None
    finally:
        # Outside the deadline: a consumer left running would keep its connections and fetch tasks.
        await consumer.stop()
    return log


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    if topic not in await consumer.topics():
        raise LookupError(f"no topic {topic} on the broker: nothing was recorded there")
    return [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]


async def _read_to(
    consumer: AIOKafkaConsumer,
    ends: dict[TopicPartition, int],
    key_prefix: bytes,
    codec: EventCodec,
    log: RequestLog,
) -> None:
    """Fetch until every partition's position reaches its end in `ends`, keeping what `_keep` keeps."""
    pending = {tp for tp, end in ends.items() if end > 0}
    by_partition: dict[int, list[RequestObserved]] = {}
    while pending:
        for tp, batch in (await consumer.getmany(*pending, timeout_ms=_FETCH_MS)).items():
            kept = by_partition.setdefault(tp.partition, [])
            for record in batch:
                _keep(log, kept, codec, record, key_prefix)
        # Positions, not records: a fetch can move past offsets that hold no record for us (control
        # batches), and the end offset is a bound, not a count.
        pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}
    for partition in sorted(by_partition):
        log.requests += by_partition[partition]


def _keep(
    log: RequestLog,
    kept: list[RequestObserved],
    codec: EventCodec,
    record: ConsumerRecord[bytes, bytes],
    prefix: bytes,
) -> None:
    log.records += 1
    if prefix and not (record.key or b"").startswith(prefix):
        log.skipped_by_key += 1
        return
    event = codec.decode(record.value)
    if isinstance(event, DecodeFailure):
        log.undecodable += 1
    elif isinstance(event, RequestObserved):
        kept.append(event)
    else:
        log.other_events += 1
