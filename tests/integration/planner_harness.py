"""Running a planner and feeding it events in integration tests: in-process or as a real process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.codec import EventCodec
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    Event,
    HeldPrefixes,
    ModelRef,
    ReplicaResidency,
    ReplicaStarted,
    RequestObserved,
)
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import KafkaSettings, settings_environment
from warmplane.shared.topics import Topics, partition_key

E = TypeVar("E", bound=Event)

MODEL = ModelRef("tiny-llama", "rev-1")


def request(
    chain: Sequence[int],
    *,
    tenant: str = "acme",
    prompt_tokens: int | None = None,
    cached_tokens: int = 0,
    at: datetime | None = None,
    replica: str = "replica-0",
    **extra: object,
) -> RequestObserved:
    """A request-observed event over `chain`, served by `replica`, 100 tokens a segment unless told
    otherwise."""
    tokens = [100 * (i + 1) for i in range(len(chain))]
    return RequestObserved(
        event_id=new_event_id(),
        occurred_at=at or datetime.now(UTC),
        producer="test",
        tenant=tenant,
        model=MODEL,
        replica=replica,
        chain=list(chain),
        chain_tokens=tokens,
        prompt_tokens=prompt_tokens if prompt_tokens is not None else tokens[-1] + 1,
        cached_tokens=cached_tokens,
        **extra,  # type: ignore[arg-type]
    )


def residency_report(
    replica: str,
    incarnation: uuid.UUID,
    at: datetime,
    held: Sequence[HeldPrefixes] = (),
    *,
    lost: int = 0,
    complete: bool = True,
    event_id: uuid.UUID | None = None,
) -> ReplicaResidency:
    """A residency report of `replica` on its start `incarnation`, made at `at` by node-1's warmer."""
    return ReplicaResidency(
        event_id=event_id or new_event_id(),
        occurred_at=at,
        producer="warmer/node-1",
        model=MODEL,
        replica=replica,
        node="node-1",
        incarnation=incarnation,
        held=list(held),
        lost=lost,
        complete=complete,
    )


def replica_started(replica: str, at: datetime) -> ReplicaStarted:
    """`replica` (on node-1) started at `at`."""
    return ReplicaStarted(
        event_id=new_event_id(),
        occurred_at=at,
        producer="warmer",
        model=MODEL,
        replica=replica,
        node="node-1",
    )


async def produce(kafka: KafkaSettings, items: Sequence[Event | tuple[str, bytes | None]]) -> None:
    """Publish events (to their topic, with their key) and raw `(topic, bytes)` records, acks=all."""
    topics = Topics(kafka.topic_prefix)
    await ensure_topics(kafka, topics.all())
    codec = EventCodec(kafka.max_event_bytes)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", linger_ms=5)
    await producer.start()
    try:
        pending = []
        for item in items:
            if isinstance(item, tuple):
                pending.append(await producer.send(item[0], value=item[1]))
            else:
                pending.append(
                    await producer.send(
                        topics.for_event(item), value=codec.encode(item), key=partition_key(item)
                    )
                )
        await asyncio.wait_for(asyncio.gather(*pending), 30)
    finally:
        await producer.stop()


async def poll_until(check: Callable[[], Awaitable[bool]], *, timeout_s: float, what: str) -> None:
    """Await `check()` until it is true; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def run_warmplane(env: dict[str, str], *args: str, timeout_s: float = 180) -> tuple[int, str]:
    """Run `warmplane ARGS` as a process with `env` (and PATH) only; (exit code, stdout and stderr)."""
    run = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("warmplane")),
        *args,
        env={"PATH": os.environ["PATH"], **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(run.communicate(), timeout_s)
    assert run.returncode is not None
    return run.returncode, output.decode()


def planner_environment(settings: PlannerSettings) -> dict[str, str]:
    """`settings` as the `WARMPLANE_*` environment a planner process reads (nothing else inherited)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("WARMPLANE_")}
    env.update(settings_environment(settings))
    return env


def start_planner_process(settings: PlannerSettings, log_path: Path) -> subprocess.Popen[bytes]:
    """A real planner process (`python -m warmplane.services.planner`), logging to `log_path`."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "warmplane.services.planner"],
            env=planner_environment(settings),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


_READ_TIMEOUT_S = 30.0


async def read_topic(kafka: KafkaSettings, topic: str) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of `topic` up to its current end, read without a group."""
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, enable_auto_commit=False)
    await asyncio.wait_for(consumer.start(), _READ_TIMEOUT_S)
    try:
        partitions = [TopicPartition(topic, p) for p in range(kafka.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning()
        ends = await consumer.end_offsets(partitions)
        records: list[ConsumerRecord[bytes, bytes]] = []
        deadline = time.monotonic() + _READ_TIMEOUT_S
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out reading {topic} with {len(records)} records read")
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                records.extend(batch)
        return records
    finally:
        await consumer.stop()


async def events_on(kafka: KafkaSettings, topic: str, kind: type[E]) -> list[E]:
    """The events of type `kind` on `topic`, each partition's in offset order, each event once, as a
    consumer takes them (`records_once`)."""
    return [event for _, event in await records_once(kafka, topic) if isinstance(event, kind)]


async def records_once(kafka: KafkaSettings, topic: str) -> list[tuple[ConsumerRecord[bytes, bytes], Event]]:
    """Every record of `topic` that decodes (see `read_topic`), with its event, each event id once: its
    first copy.

    Publishing is at least once: a publish retried after a timeout whose records the broker had in fact
    written leaves a second copy, with the same `event_id`, which every consumer drops (the id is their
    idempotency key). Events published twice under different ids are two events and both stay."""
    codec = EventCodec(kafka.max_event_bytes)
    seen: set[uuid.UUID] = set()
    found: list[tuple[ConsumerRecord[bytes, bytes], Event]] = []
    for record in await read_topic(kafka, topic):
        event = codec.decode(record.value)
        if isinstance(event, Event) and event.event_id not in seen:
            seen.add(event.event_id)
            found.append((record, event))
    return found


async def events_by_time(kafka: KafkaSettings, topic: str) -> list[Event]:
    """Every event on `topic` (see `read_topic`), across partitions in the order they occurred."""
    return sorted(await events_on(kafka, topic, Event), key=lambda event: event.occurred_at)


async def record_start(pool: asyncpg.Pool, replica: str, at: datetime) -> uuid.UUID:
    """A `starting` transition of `replica` at `at`, written as the planner writes it; its event id."""
    event_id = new_event_id()
    await pool.execute(
        "INSERT INTO replica_transitions (event_id, replica_id, state, occurred_at)"
        " VALUES ($1, $2, 'starting', $3)",
        event_id,
        replica,
        at,
    )
    return event_id
