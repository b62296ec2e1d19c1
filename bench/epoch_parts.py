"""The parts `bench.epoch_bench` runs, wired as deployed: the planner as its own process, warmers and
gateways (here in the bench's process), the traffic they plan from, and a plain consumer of the
lifecycle topic that notes when each event reaches it (the baseline).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import SecretStr

from bench.recording_engine import BLOCK_SIZE, RecordingEngine
from warmplane.services.gateway.service import Gateway
from warmplane.services.gateway.settings import GatewayOptions, GatewaySettings
from warmplane.services.planner.settings import IngestSettings, PlannerSettings
from warmplane.services.warmer.service import Warmer
from warmplane.services.warmer.settings import EngineSettings, WarmerSettings
from warmplane.shared.codec import EventCodec
from warmplane.shared.embedded import EmbeddedPostgres
from warmplane.shared.embedded.processes import log_tail, start_process, stop_process_group
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import Event, ModelRef, PrefixPayload, RequestObserved
from warmplane.shared.group_consumer import stop_reader
from warmplane.shared.settings import KafkaSettings, PostgresSettings, settings_environment
from warmplane.shared.topics import Topics

TENANT = "acme"
MODEL = "stub-model"
SECRET = "epoch-bench-salt-secret"
KEY = "sk-epoch-bench-key"
START_TIMEOUT_S = 180.0


@dataclass(frozen=True, slots=True)
class BumpTimes:
    """Seconds from one bump's publish until each gateway and each warmer used its salt, and until the
    plain consumer got it."""

    gateways: list[float]
    warmers: list[float]
    broker: float

    @property
    def every_part(self) -> float:
        return max(self.gateways + self.warmers)

    def describe(self) -> str:
        return (
            f"every part {1000 * self.every_part:.0f} ms (gateways {1000 * max(self.gateways):.0f} ms,"
            f" warmers {1000 * max(self.warmers):.0f} ms); broker hop {1000 * self.broker:.0f} ms"
        )


def traffic(conversations: int, seed: int = 7) -> list[Event]:
    """Three requests through each of `conversations` chats [system prompt, turn], the first carrying its
    payload (what a plan warms), as a gateway reports them."""
    rng = random.Random(seed)
    events: list[Event] = []
    for _ in range(conversations):
        root, leaf = rng.getrandbits(62), rng.getrandbits(62)
        words = " ".join(f"w{rng.randrange(100_000)}" for _ in range(150))
        messages = [{"role": "system", "content": words}, {"role": "user", "content": words[:200]}]
        for repeat in range(3):
            events.append(
                RequestObserved(
                    event_id=new_event_id(),
                    occurred_at=datetime.now(UTC),
                    producer="epoch-bench",
                    tenant=TENANT,
                    model=ModelRef(MODEL),
                    replica="earlier",
                    chain=[root, leaf],
                    chain_tokens=[256, 320],
                    prompt_tokens=321,
                    payload=PrefixPayload(prefix_id=leaf, messages=messages) if repeat == 0 else None,
                )
            )
    return events


@contextlib.asynccontextmanager
async def planner_process(kafka: KafkaSettings, postgres: EmbeddedPostgres, log: Path) -> AsyncIterator[None]:
    """`python -m warmplane.services.planner` on this broker and database until the block ends; raises,
    quoting its log, if it exits by itself meanwhile (checked when the block ends)."""
    settings = PlannerSettings(
        kafka=kafka,
        postgres=PostgresSettings(url=SecretStr(postgres.asyncpg_dsn)),
        ingest=IngestSettings(group_id=f"epoch-bench-{uuid.uuid4().hex[:6]}"),
        metrics_port=0,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMPLANE_")}
    env.update(settings_environment(settings))
    proc = start_process([sys.executable, "-m", "warmplane.services.planner"], log, env=env)
    try:
        yield
        if proc.poll() is not None:
            raise RuntimeError(f"the planner exited with code {proc.returncode}:\n{log_tail(log)}")
    finally:
        stop_process_group(proc, 30)


@contextlib.asynccontextmanager
async def running_warmers(
    kafka: KafkaSettings, engines: list[RecordingEngine]
) -> AsyncIterator[list[Warmer]]:
    """A warmer per engine, each its own node with one replica; yielded once every replica is ready."""
    async with contextlib.AsyncExitStack() as stack:
        warmers = []
        for i, engine in enumerate(engines):
            settings = WarmerSettings(
                kafka=kafka,
                node=f"node-{i}",
                engines=[
                    EngineSettings(
                        replica=f"replica-{i}", url=engine.url, served_model=MODEL, block_size=BLOCK_SIZE
                    )
                ],
                tenant_secrets={TENANT: SecretStr(SECRET)},
                http_host="127.0.0.1",
                http_port=0,
            )
            warmers.append(await stack.enter_async_context(Warmer(settings)))
        await _until(lambda: all(warmer.ready() for warmer in warmers), "every replica ready")
        yield warmers


@contextlib.asynccontextmanager
async def running_gateways(kafka: KafkaSettings, count: int, replicas: int) -> AsyncIterator[list[Gateway]]:
    """`count` gateways following the lifecycle topic; yielded once each routes to `replicas` replicas."""
    async with contextlib.AsyncExitStack() as stack:
        gateways = []
        for i in range(count):
            settings = GatewaySettings(
                kafka=kafka,
                tenant_keys={TENANT: [SecretStr(KEY)]},
                tenant_secrets={TENANT: SecretStr(SECRET)},
                gateway=GatewayOptions(
                    http_host="127.0.0.1",
                    http_port=0,
                    metrics_port=0,
                    block_size=BLOCK_SIZE,
                    instance=f"epoch-bench-{i}",
                    registry_seed=False,
                ),
            )
            gateways.append(await stack.enter_async_context(Gateway(settings)))

        def routed() -> bool:
            now = datetime.now(UTC).timestamp()
            return all(
                gateway.parts is not None
                and len(gateway.parts.router.membership.ready(MODEL, now)) == replicas
                for gateway in gateways
            )

        await _until(routed, f"every gateway routing to {replicas} replicas")
        yield gateways


class LifecycleWatch:
    """A plain aiokafka consumer of the lifecycle topic from its end: `seen` maps each event id it reads
    to `time.perf_counter()` when it was read."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._kafka = kafka
        self._codec = EventCodec(kafka.max_event_bytes)
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self.seen: dict[uuid.UUID, float] = {}

    async def __aenter__(self) -> LifecycleWatch:
        topic = Topics(self._kafka.topic_prefix).lifecycle
        # Fetches wait as a gateway's lifecycle follower's do: on the embedded broker, a hop's time
        # depends on it.
        consumer = self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self._kafka.bootstrap_servers, fetch_max_wait_ms=self._kafka.fetch_max_wait_ms
        )
        await consumer.start()
        partitions = [TopicPartition(topic, p) for p in range(self._kafka.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_end(*partitions)
        for partition in partitions:  # resolved now, not on the first bump's fetch
            await consumer.position(partition)
        self._task = asyncio.create_task(self._read(consumer), name="lifecycle watch")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await stop_reader(self._task, self._consumer)

    async def _read(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                now = time.perf_counter()
                for record in records:
                    event = self._codec.decode(record.value)
                    if isinstance(event, Event):
                        self.seen[event.event_id] = now


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} after {START_TIMEOUT_S:.0f} s")
        await asyncio.sleep(0.05)
