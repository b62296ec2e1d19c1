"""A whole planner's memory at a history's size, for `bench.statistics_read_bench`.

`statistics_read_bench` measures a read and its trie in its own process (tracemalloc). This starts the
planner itself (`python -m warmplane.services.planner`, as deployed) on the bench's database and an
embedded broker, and reads its resident memory from /proc: once it has planned a start for a model with no
history (the planner up, its imports and connections: the baseline), then after it planned a start for the
bench's model, whose plan reads that history and keeps its trie (`kept_reads`). The peak (`VmHWM`) covers
the read, the build and the choice; what stays (`VmRSS`) is what the planner carries between plans.

The planner's other memory grows with ingestion, not with history, and is bounded by settings: the node
cache (`node_cache_size` nodes, emptied whole when full) and the ingestion queues. A planner that only
plans holds an empty node cache, so `node_cache_bytes` measures a full one apart (tracemalloc): the
planner's bound is its peak here plus that.
"""

from __future__ import annotations

import asyncio
import random
import time
import tracemalloc
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from aiokafka import AIOKafkaProducer
from pydantic import SecretStr

from bench.plan_latency_bench import Arrivals, planner_process, plans_at_the_warmer
from warmplane.services.planner.core.node_cache import NodeCache
from warmplane.services.planner.settings import PlannerSettings, PlanSettings
from warmplane.shared.codec import EventCodec
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.embedded.processes import free_port
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, ReplicaStarted
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import KafkaSettings, PostgresSettings
from warmplane.shared.topics import Topics, partition_key

_PLAN_WAIT_S = 120.0
"""How long a start may wait for its plan (the first one waits for the planner to start and join)."""


@dataclass(frozen=True)
class PlannerMemory:
    """A planner process's resident memory in bytes (module doc)."""

    up: int
    """After planning a start for a model with no history."""
    peak: int
    """The most it held, up to and through the plan of the history's model."""
    after: int
    """Resident once that plan is out."""


async def planner_memory(
    dsn: str, workdir: Path, model: str, plans: list[PlanSettings]
) -> list[PlannerMemory]:
    """A planner's memory with each of `plans` (a fresh process each) planning a start of `model` from
    the history in `dsn`."""
    with EmbeddedKafka(workdir / "kafka") as broker:
        kafka = KafkaSettings(
            bootstrap_servers=broker.bootstrap_servers, session_timeout_ms=6_000, fetch_max_wait_ms=20
        )
        await ensure_topics(kafka, Topics(kafka.topic_prefix).all())
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
        await producer.start()
        warmer = plans_at_the_warmer(kafka)
        found = []
        try:
            async with warmer.reading():
                for run, plan_settings in enumerate(plans):
                    settings = PlannerSettings(
                        kafka=kafka,
                        postgres=PostgresSettings(url=SecretStr(dsn)),
                        plans=plan_settings,
                        metrics_port=free_port(),
                    )
                    async with planner_process(settings, workdir / f"planner-{run}.log") as child:
                        started = _Starts(kafka, producer, warmer)
                        await started.planned(ModelRef(f"no-history-{run}", "r1"), f"baseline-{run}")
                        up = _resident(child.pid)["VmRSS"]
                        await started.planned(ModelRef(model, "r1"), f"measured-{run}")
                        status = _resident(child.pid)
                        found.append(PlannerMemory(up=up, peak=status["VmHWM"], after=status["VmRSS"]))
        finally:
            await producer.stop()
    return found


class _Starts:
    def __init__(self, kafka: KafkaSettings, producer: AIOKafkaProducer, warmer: Arrivals) -> None:
        self._lifecycle = Topics(kafka.topic_prefix).lifecycle
        self._codec = EventCodec(kafka.max_event_bytes)
        self._producer = producer
        self._warmer = warmer

    async def planned(self, model: ModelRef, replica: str) -> None:
        """Announce `replica` of `model` started, and return once its plan reached the warmer."""
        start = ReplicaStarted(
            event_id=new_event_id(),
            occurred_at=datetime.now(UTC),
            producer="bench",
            model=model,
            replica=replica,
            node="node-0",
        )
        encoded = self._codec.encode(start)
        await self._producer.send_and_wait(self._lifecycle, encoded, key=partition_key(start))
        deadline = time.monotonic() + _PLAN_WAIT_S
        while start.event_id not in self._warmer.arrived:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no plan for {replica} within {_PLAN_WAIT_S:.0f} s")
            await asyncio.sleep(0.01)


def _resident(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of process `pid`, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def node_cache_bytes(nodes: int, seed: int = 3) -> int:
    """What a node cache holding `nodes` chain nodes (random 63-bit ids, one scope) takes: its sets and
    the ids themselves, which outlive the events they were decoded from (tracemalloc)."""
    rng = random.Random(seed)
    tracemalloc.start()
    try:
        cache = NodeCache(capacity=nodes)
        cache.add_all({("acme", "chat-model", "p1"): [rng.getrandbits(63) for _ in range(nodes)]}, now=0.0)
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
