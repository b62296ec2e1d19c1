"""Epoch propagation: from an epoch bump until every warmer and every gateway uses the new epoch's salt,
beside the broker's own produce-to-consume time for the same message. Run:

    python -m bench.epoch_bench [--bumps 20] [--warmers 4] [--gateways 4] [--conversations 32]

On the embedded broker and PostgreSQL (migrated): a planner as its own process, as deployed, and in this
process `--warmers` warmers (`Warmer`, one replica each) and `--gateways` gateways (`Gateway`, following
the lifecycle topic). Each replica is a `RecordingEngine`, a stub that answers at once and notes when
each cache salt first reached it: prefill is not measured here (`bench.warm_bench` measures it). First,
`--conversations` chats of one tenant with their payloads are published as traffic, so that a re-plan
has something to warm; the replicas start, are planned, warmed and turn ready.

Then `--bumps` times, each once every replica has been idle a moment: an `epoch.bumped` for the tenant
and model is published as `POST /v1/epochs/bump` (and `warmplane bump-epoch`) publishes it, on the
lifecycle topic, acknowledged by the broker. Timed from just before that publish: a gateway, until its
epoch book holds the new epoch (its next request's salt; one request through each gateway then checks
that its replica got the new salt); a warmer, until its replica gets the first request under the new
salt (the planner re-plans the model's live replicas for the new epoch, the warmer runs the plan). The
headline is the time until the last of them; the baseline, the same bump's time from that publish to a
plain aiokafka consumer already reading the lifecycle topic in this process: one broker hop, which is
all a gateway needs, while a warmer's path goes through the planner and the plans topic. Medians and
p99 over the bumps (nearest rank: with fewer than 51 bumps, p99 is the largest).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from statistics import median

import httpx

from bench.epoch_parts import (
    KEY,
    MODEL,
    SECRET,
    TENANT,
    BumpTimes,
    LifecycleWatch,
    planner_process,
    running_gateways,
    running_warmers,
    traffic,
)
from bench.recording_engine import CHECK_PREFIX, RecordingEngine
from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.services.gateway.service import Gateway
from warmplane.shared import migrate
from warmplane.shared.cache_salt import derive_cache_salt
from warmplane.shared.codec import EventCodec
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.event_publisher import KafkaEventPublisher, acknowledging_producer
from warmplane.shared.events import EpochBumped, ModelRef
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics

BUMP_TIMEOUT_S = 60.0
IDLE_S = 0.3
"""How long every replica must have had no request before the next bump (the last plan has run)."""
POLL_S = 0.001


@contextlib.asynccontextmanager
async def acknowledged_publisher(kafka: KafkaSettings) -> AsyncIterator[KafkaEventPublisher]:
    producer = acknowledging_producer(kafka, "epoch-bench")
    await producer.start()
    try:
        yield KafkaEventPublisher(producer, Topics(kafka.topic_prefix), EventCodec(), timeout_s=30)
    finally:
        await producer.stop()


async def bump(
    epoch: int,
    publisher: KafkaEventPublisher,
    watch: LifecycleWatch,
    engines: list[RecordingEngine],
    gateways: list[Gateway],
) -> BumpTimes:
    """Publish the bump to `epoch`; seconds until each part uses its salt, and until the watch saw it."""
    event = EpochBumped(
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="api:epoch-bench",
        tenant=TENANT,
        model=ModelRef(MODEL),
        epoch=epoch,
        reason="bench.epoch_bench",
    )
    salt = derive_cache_salt(SECRET.encode(), TENANT, MODEL, epoch)
    books = [gateway.parts.epochs for gateway in gateways if gateway.parts is not None]
    began = time.perf_counter()
    await publisher.publish(event)
    at_gateway: dict[int, float] = {}
    while True:
        now = time.perf_counter()
        for i, book in enumerate(books):
            if i not in at_gateway and book.epoch(TENANT, MODEL) >= epoch:
                at_gateway[i] = now
        warmed = [engine.first_seen.get(salt) for engine in engines]
        seen = watch.seen.get(event.event_id)
        if len(at_gateway) == len(books) and seen is not None and all(at is not None for at in warmed):
            break
        if now - began > BUMP_TIMEOUT_S:
            raise RuntimeError(
                f"epoch {epoch}: after {BUMP_TIMEOUT_S:.0f} s, {len(at_gateway)} of {len(books)} gateways and"
                f" {sum(at is not None for at in warmed)} of {len(engines)} warmers use its salt"
            )
        await asyncio.sleep(POLL_S)
    return BumpTimes(
        gateways=[at_gateway[i] - began for i in range(len(books))],
        warmers=[(at or 0.0) - began for at in warmed],
        broker=seen - began,
    )


async def check_gateways(epoch: int, gateways: list[Gateway], engines: list[RecordingEngine]) -> None:
    """One chat through each gateway: the replica it reaches must get the new epoch's salt."""
    salt = derive_cache_salt(SECRET.encode(), TENANT, MODEL, epoch)
    rng = random.Random(epoch)
    system = " ".join(f"word{rng.randrange(10_000)}" for _ in range(200))
    headers = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(headers=headers, timeout=30) as client:
        for i, gateway in enumerate(gateways):
            check = f"{CHECK_PREFIX} {epoch} {i}"
            messages = [{"role": "system", "content": system}, {"role": "user", "content": check}]
            body = {"model": MODEL, "max_tokens": 1, "messages": messages}
            response = await client.post(f"{gateway.url}/v1/chat/completions", json=body)
            response.raise_for_status()
            got = [engine.checks[check] for engine in engines if check in engine.checks]
            if got != [salt]:
                raise RuntimeError(f"epoch {epoch}: gateway {i}'s request reached its replica with {got}")


async def until_idle(engines: list[RecordingEngine]) -> None:
    """Until no replica has had a request for `IDLE_S` (the last plan ran to its end); bounded."""
    deadline = time.perf_counter() + BUMP_TIMEOUT_S
    while time.perf_counter() - max(engine.last_request for engine in engines) < IDLE_S:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the replicas were never idle for {IDLE_S} s")
        await asyncio.sleep(0.05)


async def measure(args: argparse.Namespace, workdir: Path) -> list[BumpTimes]:
    with EmbeddedKafka(workdir / "kafka") as broker, EmbeddedPostgres(workdir / "postgres") as postgres:
        await asyncio.to_thread(migrate.upgrade, postgres.sqlalchemy_url)
        kafka = KafkaSettings(
            bootstrap_servers=broker.bootstrap_servers, session_timeout_ms=2_000, heartbeat_interval_ms=500
        )
        await ensure_topics(kafka, Topics(kafka.topic_prefix).all())
        async with contextlib.AsyncExitStack() as stack:
            publisher = await stack.enter_async_context(acknowledged_publisher(kafka))
            await publisher.publish_all(traffic(args.conversations))
            await stack.enter_async_context(planner_process(kafka, postgres, workdir / "planner.log"))
            engines = [await stack.enter_async_context(RecordingEngine()) for _ in range(args.warmers)]
            await stack.enter_async_context(running_warmers(kafka, engines))
            gateways = await stack.enter_async_context(running_gateways(kafka, args.gateways, args.warmers))
            holding_nothing = [i for i, engine in enumerate(engines) if not engine.first_seen]
            if holding_nothing:
                raise RuntimeError(
                    f"replicas {holding_nothing} were warmed with nothing (the ring gave them no chat):"
                    " a re-plan would not reach them; give more --conversations"
                )
            watch = await stack.enter_async_context(LifecycleWatch(kafka))
            times = []
            for epoch in range(1, args.bumps + 1):
                await until_idle(engines)
                times.append(await bump(epoch, publisher, watch, engines, gateways))
                await check_gateways(epoch, gateways, engines)
                print(f"bump {epoch}: {times[-1].describe()}", flush=True)
            return times


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile: with 20 values, p99 is the largest."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def summarise(recorder: SummaryRecorder, times: list[BumpTimes], args: argparse.Namespace) -> None:
    """Milliseconds per bump until the last part, the last gateway and the last warmer used the new
    salt, against the broker hop of the same bump; medians and p99 over the bumps."""
    kinds = {
        f"every warmer ({args.warmers}) and gateway ({args.gateways})": [t.every_part for t in times],
        f"every gateway ({args.gateways})": [max(t.gateways) for t in times],
        f"every warmer ({args.warmers})": [max(t.warmers) for t in times],
        "a plain consumer (one broker hop)": [t.broker for t in times],
    }
    broker = [1000 * t.broker for t in times]
    hop = "broker hop: publish -> a plain consumer"
    for index, (kind, seconds) in enumerate(list(kinds.items())[:3]):
        ms = [1000 * value for value in seconds]
        recorder.figure(f"bump -> {kind} on the new salt, median", median(ms), "ms", (hop, median(broker)))
        if index == 0:
            p99 = percentile(ms, 0.99)
            recorder.figure(
                f"bump -> {kind} on the new salt, p99", p99, "ms", (f"{hop}, p99", percentile(broker, 0.99))
            )
    recorder.table(
        f"Milliseconds from the bump's publish until ..., over {len(times)} bumps.",
        ["until", "median", "p99", "max"],
        [
            [kind, *(f"{1000 * value:.1f}" for value in (median(s), percentile(s, 0.99), max(s)))]
            for kind, s in kinds.items()
        ],
    )
    recorder.note(
        "A gateway needs one broker hop (the lifecycle topic); a warmer's path is the planner's ingest of"
        " the bump, its re-plan of the model's live replicas, the plans topic, then the warmer's first warm"
        " request: its ratio to one hop is what the planner adds. The gateways and warmers share this"
        " process (and the machine's 2 cores with the planner, the broker and Postgres)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bumps", type=int, default=20)
    parser.add_argument("--warmers", type=int, default=4)
    parser.add_argument("--gateways", type=int, default=4)
    parser.add_argument(
        "--conversations", type=int, default=32, help="chats a re-plan warms, spread over the replicas"
    )
    add_summary_option(parser)
    args = parser.parse_args()
    recorder = SummaryRecorder(
        bench="epoch",
        title="An epoch bump until every warmer and gateway uses the new salt, against one broker hop",
        module="bench.epoch_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=args.bumps,
    )
    with tempfile.TemporaryDirectory(prefix="warmplane-epoch-bench-") as folder:
        times = asyncio.run(measure(args, Path(folder)))
    summarise(recorder, times, args)
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
