"""Two planners of one group, the second joining mid-stream (issue 19): the group rebalances while batches
are read, queued and written, and every event is counted exactly once. Then replicas start one after
another, their starts keyed to every lifecycle partition: both planners plan some, and each plan holds what
one chooser over the same database chooses for that replica. Plans read the counts every planner commits
to Postgres, so which planner owns a replica's partition changes nothing in its plan."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import msgspec
from aiokafka.partitioner import DefaultPartitioner

from tests.integration.planner.ingest_stream import (
    COUNTED,
    TENANTS,
    Stream,
    assert_counted_once,
    drained,
    retried_stream,
)
from tests.integration.planner_harness import (
    MODEL,
    events_on,
    poll_until,
    produce,
    replica_started,
    start_planner_process,
)
from warmplane.services.planner.pg_plans import PgPlanStore
from warmplane.services.planner.plan_choice import WarmSetChooser
from warmplane.services.planner.settings import IngestSettings, PlannerSettings, PlanSettings
from warmplane.shared.events import PrefixPayload, RequestObserved, WarmPlanIssued
from warmplane.shared.topics import Topics, partition_key

EVENTS = 60_000
_CHUNK = 2_000
ROOTS = 40
_TIMEOUT_S = 120.0


def with_root_payloads(stream: Stream) -> Stream:
    """`stream` with each (tenant, root)'s first request carrying its root's payload, so plans have
    something to warm; the counts are the same."""
    events = list(stream.events)
    catalogued: set[tuple[str, int]] = set()
    for i, event in enumerate(events):
        if isinstance(event, RequestObserved) and (event.tenant, event.chain[0]) not in catalogued:
            catalogued.add((event.tenant, event.chain[0]))
            root = PrefixPayload(event.chain[0], prompt=f"{event.tenant} root {event.chain[0]}")
            events[i] = msgspec.structs.replace(event, payload=root)
    assert len(catalogued) == len(TENANTS) * ROOTS
    return Stream(events, stream.by_leaf, stream.by_replica)


def replicas_on_every_partition(partitions: int, each: int) -> list[str]:
    """Replica names whose lifecycle keys land `each` on every partition, in turn."""
    on: dict[int, list[str]] = {p: [] for p in range(partitions)}
    every = list(range(partitions))
    for n in range(10_000):
        name = f"r-{n}"
        partition = DefaultPartitioner()(name.encode(), every, every)
        if len(on[partition]) < each:
            on[partition].append(name)
        if all(len(names) == each for names in on.values()):
            return [names[k] for k in range(each) for names in on.values()]
    raise AssertionError("no replica names cover every partition")


def issued_by(log: Path) -> set[str]:
    """The replicas a planner's log says it issued plans for."""
    return set(re.findall(r"issued plan \S+ for replica (\S+) on", log.read_text()))


async def test_a_rebalance_mid_stream_counts_once_and_either_planner_plans_as_one_would(
    planner_settings: PlannerSettings, tmp_path: Path
) -> None:
    settings = planner_settings.model_copy(
        update={
            # Small batches: each planner has several read, queued and being written when the group moves.
            "ingest": IngestSettings(
                group_id=planner_settings.ingest.group_id, batch_max_records=1_000, batch_timeout_ms=50
            ),
            # Every catalogued prefix the ring sends a replica fits its plan: the plan is the ring's share,
            # which the chooser in this test computes over the same rows.
            "plans": PlanSettings(
                min_expected_saved_tokens=0, min_reuse_probability=0.0, statistics_max_age_s=0
            ),
        }
    )
    stream = with_root_payloads(retried_stream(seed=31, count=EVENTS))
    logs = [tmp_path / "planner-a.log", tmp_path / "planner-b.log"]
    db = await asyncpg.connect(settings.postgres.asyncpg_dsn())
    planners: list[subprocess.Popen[bytes]] = []
    feeding: asyncio.Task[None] | None = None
    try:

        async def counted(share: float) -> bool:
            return bool(await db.fetchval(COUNTED) >= stream.total * share)

        async def assigned() -> bool:
            return "resumed" in logs[1].read_text()

        b_assigned = asyncio.Event()

        async def feed() -> None:
            """The stream in chunks, as traffic comes; its last part only once planner b holds partitions,
            so the group moves while events flow and both planners count part of them."""
            held_from = len(stream.events) * 7 // 10
            for at in range(0, len(stream.events), _CHUNK):
                if at >= held_from:
                    await b_assigned.wait()
                await produce(settings.kafka, stream.events[at : at + _CHUNK])

        planners.append(start_planner_process(settings, logs[0]))
        feeding = asyncio.create_task(feed())
        await poll_until(lambda: counted(0.15), timeout_s=_TIMEOUT_S, what="planner a counting")
        planners.append(start_planner_process(settings, logs[1]))
        await poll_until(assigned, timeout_s=_TIMEOUT_S, what="planner b's partitions")
        b_assigned.set()
        await asyncio.wait_for(feeding, _TIMEOUT_S)
        await poll_until(
            lambda: drained(db, settings, stream), timeout_s=_TIMEOUT_S, what="both planners to drain it"
        )
        await assert_counted_once(db, stream)

        pool = await asyncpg.create_pool(settings.postgres.asyncpg_dsn(), min_size=1, max_size=2)
        try:
            replicas = replicas_on_every_partition(settings.kafka.partitions, each=2)
            items = {replica: await _start_and_compare(settings, pool, replica) for replica in replicas}
        finally:
            await pool.close()
        for log in logs:  # a plan may be empty (the ring sent its replica no catalogued root); not all
            assert any(items[replica] for replica in issued_by(log)), f"{log.name}: {items}"
    finally:
        if feeding is not None:
            feeding.cancel()
        for planner in planners:
            planner.send_signal(signal.SIGTERM)
        for planner, log in zip(planners, logs, strict=False):
            assert planner.wait(30) == 0, log.read_text()[-3000:]
        await db.close()


async def _start_and_compare(settings: PlannerSettings, pool: asyncpg.Pool, replica: str) -> int:
    """Start `replica`, wait for its plan, and compare its items with a chooser's over the same rows at the
    plan's moment (the replicas started before it are live: the ring is the same); how many items."""
    started = replica_started(replica, datetime.now(UTC))
    assert partition_key(started) == replica.encode()
    await produce(settings.kafka, [started])
    plans: list[WarmPlanIssued] = []

    async def planned() -> bool:
        plans[:] = [
            plan
            for plan in await events_on(
                settings.kafka, Topics(settings.kafka.topic_prefix).plans, WarmPlanIssued
            )
            if plan.trigger_event_id == started.event_id
        ]
        return bool(plans)

    await poll_until(planned, timeout_s=_TIMEOUT_S, what=f"the plan of {replica}")
    [plan] = plans
    chooser = WarmSetChooser(
        PgPlanStore(pool),
        settings.plans,
        settings.routing,
        bucket_seconds=settings.statistics.bucket_seconds,
        max_plan_bytes=settings.kafka.max_event_bytes,
        clock=lambda: plan.occurred_at,
    )
    [choice] = (await chooser.choose(MODEL.name, None, 0, [replica])).values()
    assert {(i.tenant, i.prefix_id, i.tokens) for i in plan.items} == {
        (i.tenant, i.prefix_id, i.tokens) for i in choice.items
    }
    return len(plan.items)
