"""Replica liveness on real parts: a planner over Postgres and the broker marks lost the replica whose
heartbeats stop while another's go on (published, recorded, and the ready replica planned for its keys),
and puts it back when its warmer speaks again as ready."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg

from tests.integration.planner.test_planner_plans import payload
from tests.integration.planner_harness import MODEL, events_on, poll_until, produce, request
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    Event,
    ReplicaBecameReady,
    ReplicaEvent,
    ReplicaHeartbeat,
    ReplicaLost,
    ReplicaStarted,
)
from warmplane.shared.settings import HeartbeatSettings, KafkaSettings
from warmplane.shared.topics import Topics

_TIMEOUT_S = 60.0
_INTERVAL_S = 0.3


def _lifecycle(kind: type[ReplicaEvent], replica: str) -> ReplicaEvent:
    return kind(
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer=f"warmer/node-{replica}",
        model=MODEL,
        replica=replica,
        node=f"node-{replica}",
        endpoint=f"http://{replica}.test:8000",
    )


def _beat(replica: str) -> ReplicaHeartbeat:
    return ReplicaHeartbeat(
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer=f"warmer/node-{replica}",
        model=MODEL,
        replica=replica,
        node=f"node-{replica}",
        state="ready",
    )


@contextlib.asynccontextmanager
async def beating(kafka: KafkaSettings, replicas: set[str]) -> AsyncIterator[set[str]]:
    """Heartbeats of `replicas` every interval, as their warmers send them, until the block ends; the set
    may change meanwhile."""

    async def beat_forever() -> None:
        while True:
            await produce(kafka, [_beat(replica) for replica in sorted(replicas)])
            await asyncio.sleep(_INTERVAL_S)  # the warmers' pace, not a wait for a condition

    task = asyncio.create_task(beat_forever())
    try:
        yield replicas
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _state(dsn: str, replica: str) -> str | None:
    db = await asyncpg.connect(dsn)
    try:
        state: str | None = await db.fetchval("SELECT state FROM replicas WHERE replica_id = $1", replica)
        return state
    finally:
        await db.close()


async def test_a_replica_whose_heartbeats_stop_is_lost_and_back_once_it_speaks_again(
    planner_settings: PlannerSettings, migrated_database: str
) -> None:
    settings = planner_settings.model_copy(
        update={"heartbeat": HeartbeatSettings(interval_s=_INTERVAL_S, missed=3)}
    )
    kafka, lifecycle = settings.kafka, Topics(settings.kafka.topic_prefix).lifecycle
    announced: list[Event] = [
        _lifecycle(kind, r) for r in ("a", "b") for kind in (ReplicaStarted, ReplicaBecameReady)
    ]
    # Prefixes all over the ring, so that b's keys are worth warming on a once b is gone.
    traffic: list[Event] = [
        request([root], payload=payload(root) if i == 0 else None) for root in range(1, 41) for i in range(3)
    ]
    async with running_planner(settings):
        await produce(kafka, traffic + announced)
        async with beating(kafka, {"a", "b"}) as beats:

            async def both_ready() -> bool:
                return [await _state(migrated_database, r) for r in ("a", "b")] == ["ready", "ready"]

            await poll_until(both_ready, timeout_s=_TIMEOUT_S, what="both replicas recorded ready")
            beats.discard("b")  # b's node is lost: its warmer says nothing more

            async def b_gone() -> bool:
                return await _state(migrated_database, "b") == "gone"

            await poll_until(b_gone, timeout_s=_TIMEOUT_S, what="b recorded gone")
            assert await _state(migrated_database, "a") == "ready"
            [lost] = await events_on(kafka, lifecycle, ReplicaLost)
            assert (lost.replica, lost.producer, lost.endpoint) == ("b", "planner", "http://b.test:8000")
            assert lost.reason.startswith("lost: not heard for ")

            async def a_planned_for_its_keys() -> bool:
                db = await asyncpg.connect(migrated_database)
                try:
                    return bool(
                        await db.fetchval(
                            "SELECT count(*) FROM warm_plans WHERE replica_id = 'a' AND trigger_event_id = $1"
                            " AND jsonb_array_length(items) > 0",
                            lost.event_id,
                        )
                    )
                finally:
                    await db.close()

            await poll_until(a_planned_for_its_keys, timeout_s=_TIMEOUT_S, what="a planned for b's keys")
            beats.add("b")  # b was only cut off: its warmer speaks again, still serving it

            async def b_back() -> bool:
                return await _state(migrated_database, "b") == "ready"

            await poll_until(b_back, timeout_s=_TIMEOUT_S, what="b recorded ready again")
    back = [e for e in await events_on(kafka, lifecycle, ReplicaBecameReady) if e.producer == "planner"]
    assert [(e.replica, e.endpoint) for e in back] == [("b", "http://b.test:8000")]
    assert len(await events_on(kafka, lifecycle, ReplicaLost)) == 1
