"""`python -m bench.soak`: the control plane under steady load, watched for leaks and losses.

    python -m bench.soak [--minutes 10] [--event-rate 1000] [--chat-rate 2] [--bump-every-s 30]

Real parts (the embedded broker, PostgreSQL, Redis, a tiny-model vLLM engine) and the four services as
processes of their own (`soak_fleet.py`) carry the load of `soak_load.py`: request events at a set rate
(as a fleet's gateways publish them), chats through the gateway (result cache on), the status page's reads
of the API, and an epoch bump through the API every so often (each one a plan and a warm on the replica).
Every few seconds each service's own process series are read from its `/metrics`.

What it reports, per service, against the same service at the end of the warm-up (the baseline of the same
run): resident memory, open descriptors and event-loop tasks at their highest after the warm-up. And the
ground truth of losses: every request event on the topic (the broker keeps them all) is counted once in
PostgreSQL, and none was dropped on the way. `tests/integration/test_soak.py` runs a minute of it in CI and
asserts the bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.soak_fleet import Parts, Reading, SoakFleet
from bench.soak_load import PRODUCER, Load, Tally
from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.shared import migrate
from warmplane.shared.codec import EventCodec
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres, EmbeddedRedis
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm, ensure_tiny_model
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
    with fleet.running():
        await _until(
            lambda: _serving(fleet), _START_TIMEOUT_S, "every service up and the replica ready", fleet
        )
        load = Load(fleet, event_rate=shape.event_rate, chat_rate=shape.chat_rate,
                    bump_every_s=shape.bump_every_s, read_every_s=shape.read_every_s)  # fmt: skip
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


async def _serving(fleet: SoakFleet) -> bool:
    """Every service's metrics answer, the warmer's replica is ready, and the gateway routes to it."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        try:
            for service in fleet.services.values():
                (await http.get(service.metrics_url)).raise_for_status()
            if (await http.get(f"{fleet.warmer_url}/ready")).status_code != 200:
                return False
            key, body = Load(fleet, event_rate=0, chat_rate=1, bump_every_s=1, read_every_s=1).chat()
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
        text = (await http.get(fleet.services["gateway"].metrics_url)).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("warmplane_gateway_events_dropped_total")
    )


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
            return int(await db.fetchval("SELECT coalesce(sum(requests), 0) FROM prefix_stats"))

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


@contextlib.contextmanager
def own_parts(workdir: Path) -> Iterator[Parts]:
    """The embedded broker, PostgreSQL (a migrated database), Redis and a tiny-model engine, stopped after."""
    with (
        EmbeddedKafka(workdir / "kafka") as kafka,
        EmbeddedPostgres(workdir / "postgres") as postgres,
        EmbeddedRedis(workdir / "redis") as redis,
        EmbeddedVllm(workdir / "vllm", ensure_tiny_model()) as engine,
    ):
        migrate.upgrade(postgres.sqlalchemy_url)
        yield Parts(kafka.bootstrap_servers, postgres.asyncpg_dsn, redis.url, engine)


def summarise(recorder: SummaryRecorder, result: SoakResult) -> None:
    """Each service's highest memory after the warm-up against its own at the warm-up's end, and what it
    holds at rest against the same; the ground truth of losses in a table and notes."""
    rows = []
    for name in result.readings:
        baseline, peak, rest = result.baseline(name), result.peak(name), result.rest[name]
        mib, peak_mib = baseline.rss_bytes / 2**20, peak.rss_bytes / 2**20
        recorder.figure(f"{name}: resident memory, highest after the warm-up", peak_mib, "MiB",
                        (f"{name} at the warm-up's end", mib))  # fmt: skip
        fds = f"{baseline.open_fds:.0f} / {rest.open_fds:.0f}"
        tasks = f"{baseline.loop_tasks:.0f} / {peak.loop_tasks:.0f} / {rest.loop_tasks:.0f}"
        rows.append([name, f"{mib:.1f}", f"{peak_mib:.1f}", f"{peak_mib / mib:.3f}", fds, tasks])
    recorder.table(
        "Per service: memory at the warm-up's end and at its highest after; descriptors at the warm-up's end"
        " and at rest after the load; event-loop tasks at the warm-up's end, at their highest, and at rest.",
        ["service", "RSS at warm-up end (MiB)", "RSS highest after (MiB)", "ratio", "fds", "tasks"],
        rows,
    )
    tally = result.tally
    recorder.note(
        f"Load: {tally.emitted:,} request events ({result.sent:,} acknowledged); chats, API reads and epoch"
        f" bumps by status: {dict(tally.chats)}, {dict(tally.reads)}, {dict(tally.bumps)}; plans by state"
        f" {result.plans}."
    )
    recorder.note(
        f"Losses: {result.on_topic:,} distinct request events on the topic, {result.counted:,} counted in"
        f" PostgreSQL, {result.dropped} dropped by the emitters; exit codes at SIGTERM {result.exit_codes}."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup-minutes", type=float, default=2.0)
    parser.add_argument("--event-rate", type=float, default=1_000.0)
    parser.add_argument("--chat-rate", type=float, default=2.0)
    parser.add_argument("--bump-every-s", type=float, default=30.0)
    add_summary_option(parser)
    args = parser.parse_args()
    shape = SoakShape(
        duration_s=args.minutes * 60, warmup_s=args.warmup_minutes * 60, event_rate=args.event_rate,
        chat_rate=args.chat_rate, bump_every_s=args.bump_every_s,
    )  # fmt: skip
    recorder = SummaryRecorder(
        bench="soak",
        title="The control plane under steady load: each service's memory, descriptors and tasks after the"
        " warm-up against its own at the warm-up's end; losses against the topic",
        module="bench.soak",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=1,
    )
    with tempfile.TemporaryDirectory(prefix="warmplane-soak-") as folder, own_parts(Path(folder)) as parts:
        result = asyncio.run(run_soak(parts, Path(folder) / "logs", shape))
    summarise(recorder, result)
    for table in recorder.tables:
        print(table.caption, table.markdown, sep="\n")
    print(*recorder.notes, sep="\n")
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
