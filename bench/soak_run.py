"""Running a soak (`python -m bench.soak` says what it is): the fleet up, the load for a while, each
service's own process series sampled, then the drain and the ground truth of losses."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.soak_fleet import Parts, Reading, SoakFleet
from bench.soak_load import PRODUCER, Load, Tally
from warmplane.shared.codec import EventCodec
from warmplane.shared.events import RequestObserved
from warmplane.shared.plan_states import FINAL_PLAN_STATES
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics

_START_TIMEOUT_S = 180.0
_DRAIN_TIMEOUT_S = 180.0


@dataclass(frozen=True, slots=True)
class SoakShape:
    duration_s: float
    warmup_s: float
    event_rate: float
    """Request events a second from the load's emitter."""
    chat_rate: float
    """Chats a second through the gateway."""
    bump_every_s: float
    read_every_s: float = 5.0
    """The status page's period."""
    sample_every_s: float = 2.0


@dataclass
class SoakResult:
    shape: SoakShape
    readings: dict[str, list[Reading]]
    rest: dict[str, Reading]
    """Each service once the load has stopped and every plan has ended: what it still holds then, it
    keeps (a leak); what it held only while busy (requests, warms in flight), it has let go."""
    tally: Tally
    sent: int
    """Request events the load's emitter had acknowledged."""
    dropped: int
    """Events the load's emitter and the gateway's dropped, together."""
    on_topic: int
    """Distinct request events on the topic: the ground truth."""
    from_load: int
    counted: int
    """Requests PostgreSQL's statistics count once ingestion drained."""
    plans: dict[str, int] = field(default_factory=dict)
    exit_codes: dict[str, int] = field(default_factory=dict)

    def baseline(self, service: str) -> Reading:
        """The service's last reading of the warm-up."""
        return [r for r in self.readings[service] if r.at_s <= self.shape.warmup_s][-1]

    def peak(self, service: str) -> Reading:
        """Each figure's highest reading after the warm-up."""
        after = [r for r in self.readings[service] if r.at_s > self.shape.warmup_s]
        return Reading(
            after[-1].at_s,
            max(r.rss_bytes for r in after),
            max(r.open_fds for r in after),
            max(r.loop_tasks for r in after),
        )


async def run_soak(parts: Parts, workdir: Path, shape: SoakShape) -> SoakResult:
    """Start the fleet, carry the load for `shape.duration_s`, drain, and gather what the result holds."""
    fleet = SoakFleet(parts, workdir)
    load = Load(fleet, event_rate=shape.event_rate, chat_rate=shape.chat_rate,
                bump_every_s=shape.bump_every_s, read_every_s=shape.read_every_s)  # fmt: skip
    with fleet.running():
        await _until(
            lambda: _serving(fleet, load), _START_TIMEOUT_S, "every service up and the replica ready", fleet
        )
        await load.emitter.start()
        began = time.monotonic()
        sampler = asyncio.create_task(_sample_forever(fleet, began, shape.sample_every_s))
        try:
            await load.run(began + shape.duration_s)
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
            await load.emitter.close()
        plans = await _plans_settled(parts.dsn, fleet)
        rest = await _at_rest(fleet, time.monotonic() - began)
        gateway_dropped = await _gateway_dropped(fleet)
        fleet.stop("gateway")  # its emitter flushes at stop: after it, the topic holds all there will be
        on_topic, from_load = await _request_events(fleet.kafka)
        counted = await _drained(parts.dsn, on_topic, fleet)
        stats = load.emitter.stats
        result = SoakResult(
            shape, {name: s.readings for name, s in fleet.services.items()}, rest, load.tally, stats.sent,
            stats.dropped_total + gateway_dropped, on_topic, from_load, counted, plans,
        )  # fmt: skip
    result.exit_codes = fleet.exit_codes
    return result


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str, fleet: SoakFleet) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if failed := fleet.failed():
            raise RuntimeError(f"services exited while waiting for {what}: {failed}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.2)


async def _serving(fleet: SoakFleet, load: Load) -> bool:
    """Every service's metrics answer, the warmer's replica is ready, and the gateway routes to it."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        try:
            for service in fleet.services.values():
                (await http.get(service.metrics_url)).raise_for_status()
            if (await http.get(f"{fleet.warmer_url}/ready")).status_code != 200:
                return False
            key, body = load.chat()
            answer = await http.post(
                f"{fleet.gateway_url}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
            )
            return answer.status_code == 200
        except httpx.HTTPError:
            return False


async def _sample_forever(fleet: SoakFleet, began: float, every_s: float) -> None:
    async with httpx.AsyncClient() as http:
        while True:
            at_s = time.monotonic() - began
            await asyncio.gather(*(s.read(http, at_s) for s in fleet.services.values()))
            await asyncio.sleep(every_s)  # the sampling period


async def _at_rest(fleet: SoakFleet, at_s: float) -> dict[str, Reading]:
    async with httpx.AsyncClient() as http:
        for service in fleet.services.values():
            await service.read(http, at_s)
    return {name: service.readings.pop() for name, service in fleet.services.items()}


async def _gateway_dropped(fleet: SoakFleet) -> int:
    async with httpx.AsyncClient(timeout=10.0) as http:
        totals = await fleet.services["gateway"].totals(http)
    return int(totals.get("warmplane_gateway_events_dropped_total", 0))


async def _request_events(kafka: KafkaSettings) -> tuple[int, int]:
    """(distinct request events on the topic, those the load published), read from the start to the end."""
    topic = Topics(kafka.topic_prefix).requests
    codec = EventCodec(kafka.max_event_bytes)
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, enable_auto_commit=False)
    await asyncio.wait_for(consumer.start(), 30)
    try:
        partitions = [TopicPartition(topic, p) for p in range(kafka.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning()
        ends = await consumer.end_offsets(partitions)
        producers: dict[object, str] = {}
        deadline = time.monotonic() + _DRAIN_TIMEOUT_S
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: {len(producers)} events read")
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                for record in batch:
                    event = codec.decode(record.value)
                    if isinstance(event, RequestObserved):
                        producers[event.event_id] = event.producer
    finally:
        await consumer.stop()
    return len(producers), sum(producer == PRODUCER for producer in producers.values())


async def _drained(dsn: str, expected: int, fleet: SoakFleet) -> int:
    """Requests counted once the count reaches `expected`, or whatever it holds at the deadline."""
    db = await asyncpg.connect(dsn)
    try:

        async def counted() -> int:
            return int(await db.fetchval("SELECT coalesce(sum(requests), 0) FROM prefix_requests"))

        with contextlib.suppress(TimeoutError):
            await _until(lambda: _at_least(counted, expected), _DRAIN_TIMEOUT_S, "ingestion to drain", fleet)
        return await counted()
    finally:
        await db.close()


async def _at_least(read: Callable[[], Awaitable[int]], expected: int) -> bool:
    return await read() >= expected


async def _plans_settled(dsn: str, fleet: SoakFleet) -> dict[str, int]:
    """Plans by state, once none is still in flight (or at the deadline)."""
    db = await asyncpg.connect(dsn)
    try:

        async def states() -> dict[str, int]:
            rows = await db.fetch("SELECT state::text, count(*) FROM warm_plans GROUP BY 1")
            return {row[0]: row[1] for row in rows}

        async def settled() -> bool:
            return set(await states()) <= FINAL_PLAN_STATES

        with contextlib.suppress(TimeoutError):
            await _until(settled, _DRAIN_TIMEOUT_S, "every plan to end", fleet)
        return await states()
    finally:
        await db.close()
