"""Residency reports on the real broker and Postgres: the planner keeps each replica's newest report, once,
in its batch's transaction; what a replica holds for planning is its report on its latest start and the
plans verified after it, or its verified plans when it has none."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import msgspec

from tests.integration.planner_harness import (
    MODEL,
    poll_until,
    produce,
    read_topic,
    record_start,
    replica_started,
    residency_report,
)
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.core.recent_ids import unpack_ids
from warmplane.services.planner.pg_plans import PgPlanStore
from warmplane.services.planner.pg_residency import record_residency
from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    HeldPrefixes,
    PrefixPayload,
    ReplicaResidency,
    WarmItem,
    WarmPlanIssued,
)
from warmplane.shared.topics import DeadLetterHeaders, Topics

_TIMEOUT_S = 30.0
RESIDENCY = "replica.residency"


def plan_of(prefix: int, at: datetime, trigger: uuid.UUID | None) -> WarmPlanIssued:
    """A plan for r-h of `prefix` (acme, epoch 0), issued at `at`."""
    payload = PrefixPayload(prefix_id=prefix, prompt=f"prefix {prefix}")
    return WarmPlanIssued(
        event_id=new_event_id(), occurred_at=at, producer="planner", model=MODEL, plan_id=new_event_id(),
        replica="r-h", node="node-1", epoch=0, items=[WarmItem(prefix, 100, payload, "acme", epoch=0)],
        budget_tokens=100, deadline=at + timedelta(minutes=2), trigger_event_id=trigger,
    )  # fmt: skip


async def stored(db: asyncpg.Connection | asyncpg.Pool, replica: str) -> dict[str, object] | None:
    """The row kept for `replica`, its `held` decoded."""
    row = await db.fetchrow("SELECT * FROM replica_residency WHERE replica_id = $1", replica)
    if row is None:
        return None
    return {**row, "held": msgspec.json.decode(row["held"], type=list[HeldPrefixes])}


def as_row(event: ReplicaResidency, held_count: int) -> dict[str, object]:
    """The row the planner keeps for `event`."""
    return {
        "replica_id": event.replica,
        "incarnation": event.incarnation,
        "event_id": event.event_id,
        "occurred_at": event.occurred_at,
        "held": event.held,
        "held_count": held_count,
        "lost": event.lost,
        "complete": event.complete,
    }


async def test_the_planner_keeps_each_replicas_newest_report_once(planner_settings: PlannerSettings) -> None:
    """Reports of one batch, then an older one and a copy in later batches: the newest stands, every
    report's id is in the ledger with the batch, and a report with a NUL in a name is dead-lettered alone."""
    kafka = planner_settings.kafka
    now = datetime.now(UTC)
    start = replica_started("r-a", now)
    older = residency_report(
        "r-a", start.event_id, now + timedelta(seconds=2), [HeldPrefixes("acme", "", 0, [9])]
    )
    newer = residency_report(
        "r-a",
        start.event_id,
        now + timedelta(seconds=3),
        [HeldPrefixes("acme", "v1", 2, [1, 2, 3]), HeldPrefixes("globex", "", 0, [-7])],
        lost=1,
    )
    other = residency_report("r-b", new_event_id(), now + timedelta(seconds=1), complete=False)
    # A NUL in a tenant name (which `jsonb` could not store) is refused by the decoder.
    fine = residency_report("r-c", new_event_id(), now, [HeldPrefixes("acme", "", 0, [5])])
    unstorable = msgspec.json.encode(fine).replace(b'"acme"', b'"ac\\u0000me"')
    topics = Topics(kafka.topic_prefix)
    await produce(kafka, [start, older, newer, other, (topics.warm_results, unstorable)])
    db = await asyncpg.connect(planner_settings.postgres.asyncpg_dsn())
    try:
        async with running_planner(planner_settings) as planner:
            await poll_until(
                lambda: _ingested(planner.metrics.events_ingested(RESIDENCY), 3),
                timeout_s=_TIMEOUT_S,
                what="three reports ingested",
            )
            assert await stored(db, "r-a") == as_row(newer, 4)
            assert await stored(db, "r-b") == as_row(other, 0)
            assert await stored(db, "r-c") is None

            # Later batches: a report older than the stored one, and a copy of the stored one.
            oldest = residency_report("r-a", start.event_id, now + timedelta(seconds=1))
            # The copy first: by the time the older report is counted, the copy was skipped.
            await produce(kafka, [newer, oldest])
            await poll_until(
                lambda: _ingested(planner.metrics.events_ingested(RESIDENCY), 4),
                timeout_s=_TIMEOUT_S,
                what="the older report ingested",
            )
            assert await stored(db, "r-a") == as_row(newer, 4)
            assert planner.metrics.duplicates._value.get() >= 1
            # The start is read by the lifecycle topic's consumer, which may join after the reports'.
            await poll_until(
                lambda: _ingested(planner.metrics.events_ingested("replica.started"), 1),
                timeout_s=_TIMEOUT_S,
                what="the start ingested",
            )
        ledger = {
            event_id.int for (packed,) in await db.fetch("SELECT event_ids FROM ingest_ledger")
            for event_id in unpack_ids(packed)
        }  # fmt: skip
        assert ledger == {e.event_id.int for e in (start, older, newer, other, oldest)}
        letters = await read_topic(kafka, topics.dead_letter)
        assert [(dict(r.headers)[DeadLetterHeaders.REASON].decode(), r.value) for r in letters] == [
            ("invalid replica.residency: names must not contain NUL - at `$.held[0]`", unstorable)
        ]
    finally:
        await db.close()


async def _ingested(count: int, expected: int) -> bool:
    return count >= expected


async def test_the_store_keeps_the_newer_report_by_time_then_id(migrated_database: str) -> None:
    """Beyond the planner's window of recent ids a copy reaches the store: it changes nothing, nor does an
    older report; of two reports at the same time the larger id stands, in either order of arrival."""
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=1)
    try:
        now = datetime.now(UTC)
        start = new_event_id()
        first = residency_report("r-s", start, now, [HeldPrefixes("acme", "", 0, [1])])
        small, large = sorted((new_event_id(), new_event_id()), key=lambda u: u.int)
        tie_small = residency_report("r-s", start, now + timedelta(seconds=1), event_id=small)
        tie_large = residency_report(
            "r-s", start, now + timedelta(seconds=1), [HeldPrefixes("acme", "", 0, [2])], event_id=large
        )

        async def write(*reports: ReplicaResidency) -> None:
            async with pool.acquire() as connection, connection.transaction():
                await record_residency(connection, reports)

        await write(first)
        await write(first)
        assert await stored(pool, "r-s") == as_row(first, 1)
        await write(tie_large)
        await write(tie_small)
        await write(first)
        assert await stored(pool, "r-s") == as_row(tie_large, 1)
        await pool.execute("DELETE FROM replica_residency")
        await write(tie_small)
        await write(tie_large)
        assert await stored(pool, "r-s") == as_row(tie_large, 1)
    finally:
        await pool.close()


async def test_a_replica_holds_its_report_on_its_latest_start_and_what_verified_after_it(
    migrated_database: str,
) -> None:
    pool = await asyncpg.create_pool(migrated_database, min_size=1, max_size=2)
    try:
        store = PgPlanStore(pool)
        now = datetime.now(UTC)

        async def start(at: datetime) -> uuid.UUID:
            return await record_start(pool, "r-h", at)

        async def verified(prefix: int, at: datetime, trigger: uuid.UUID | None = None) -> None:
            """A plan of `prefix` (acme, epoch 0) issued and verified at `at` (warmer's clock)."""
            plan = plan_of(prefix, at, trigger)
            assert await store.record([(plan, trigger or new_event_id())]) == {plan.plan_id}
            await pool.execute(
                "UPDATE warm_plans SET state = 'verified', finished_at = $2 WHERE plan_id = $1",
                plan.plan_id,
                at,
            )

        async def reported(incarnation: uuid.UUID, at: datetime, held: list[HeldPrefixes]) -> None:
            async with pool.acquire() as connection, connection.transaction():
                await record_residency(
                    connection, [residency_report("r-h", incarnation, at, held, complete=False)]
                )

        async def held() -> set[tuple[int, str, int]]:
            items = await store.held("r-h")
            as_set = {(h.prefix_id, h.tenant, h.epoch) for h in items}
            assert len(as_set) == len(items), "each prefix once"
            return as_set

        first = await start(now)
        await verified(1, now + timedelta(seconds=1), trigger=first)
        await verified(2, now + timedelta(seconds=2))
        # No report: what its verified plans warmed.
        assert await held() == {(1, "acme", 0), (2, "acme", 0)}

        # Its warmer reports prefix 1 lost, and holds 3 of globex (in two namespaces) and 2 again.
        await reported(
            first,
            now + timedelta(seconds=3),
            [
                HeldPrefixes("acme", "", 0, [2]),
                HeldPrefixes("globex", "v2", 5, [3]),
                HeldPrefixes("globex", "", 4, [3]),
            ],
        )
        assert await held() == {(2, "acme", 0), (3, "globex", 5), (3, "globex", 4)}
        # Plans verified after the report add their items; one finished at the report's instant is taken as
        # the report saw it (4 is not held).
        await verified(4, now + timedelta(seconds=3))
        await verified(5, now + timedelta(seconds=4))
        await verified(2, now + timedelta(seconds=5))
        assert await held() == {(2, "acme", 0), (3, "globex", 5), (3, "globex", 4), (5, "acme", 0)}

        # It crashed and came back: the report on the earlier start no longer counts.
        second = await start(now + timedelta(seconds=10))
        assert await held() == set()
        await verified(6, now + timedelta(seconds=11), trigger=second)
        assert await held() == {(6, "acme", 0)}
        # Its warmer reports on the new start: nothing of 6 is left.
        await reported(second, now + timedelta(seconds=12), [])
        assert await held() == set()
    finally:
        await pool.close()
