"""One behaviour suite for what issuing plans needs of the planner's store (`plans.PlanStore`: recording a
plan per trigger and replica, and the outbox of plans the broker has not acknowledged), run against the
memory twin (`tests/unit/planner/test_plan_store_memory.py`) and Postgres
(`tests/integration/planner/test_plan_store_pg.py`).
Reads that only ingestion fills (statistics, outcomes, unplanned starts) are the adapter's own tests'."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from warmplane.services.planner.plans import PlanStore
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, PrefixPayload, WarmItem, WarmPlanIssued

AT = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def _plan(replica: str, trigger: uuid.UUID, *, at: datetime = AT, deadline_s: float = 600) -> WarmPlanIssued:
    return WarmPlanIssued(
        event_id=new_event_id(),
        occurred_at=at,
        producer="planner",
        model=ModelRef("m", "r1"),
        plan_id=uuid.uuid4(),
        replica=replica,
        node="node-0",
        epoch=0,
        items=[WarmItem(7, 300, PrefixPayload(7, prompt="You are helpful."), "acme")],
        budget_tokens=300,
        deadline=at + timedelta(seconds=deadline_s),
        trigger_event_id=trigger,
    )


async def a_replica_gets_one_plan_per_trigger(store: PlanStore) -> None:
    trigger = uuid.uuid4()
    first, again, other = _plan("r-0", trigger), _plan("r-0", trigger), _plan("r-1", trigger)
    assert await store.record([(first, trigger)]) == {first.plan_id}
    assert await store.record([(again, trigger), (other, trigger)]) == {other.plan_id}
    later = _plan("r-0", uuid.uuid4())
    assert await store.record([(later, later.trigger_event_id or trigger)]) == {later.plan_id}, "a new start"


async def recorded_plans_wait_to_be_published_oldest_first(store: PlanStore) -> None:
    old, new = _plan("r-0", uuid.uuid4(), at=AT), _plan("r-1", uuid.uuid4(), at=AT + timedelta(seconds=5))
    await store.record([(new, new.trigger_event_id or uuid.uuid4())])
    await store.record([(old, old.trigger_event_id or uuid.uuid4())])
    assert await store.unpublished(issued_before=AT + timedelta(minutes=1), alive_at=AT) == [old, new]
    assert await store.unpublished(issued_before=AT + timedelta(seconds=1), alive_at=AT) == [old]
    await store.mark_published([old.plan_id], AT + timedelta(seconds=10))
    assert await store.unpublished(issued_before=AT + timedelta(minutes=1), alive_at=AT) == [new]


async def a_plan_past_its_deadline_is_not_published_again(store: PlanStore) -> None:
    plan = _plan("r-0", uuid.uuid4(), deadline_s=60)
    await store.record([(plan, plan.trigger_event_id or uuid.uuid4())])
    assert await store.unpublished(issued_before=AT + timedelta(hours=1), alive_at=AT + timedelta(seconds=59))
    assert (
        await store.unpublished(issued_before=AT + timedelta(hours=1), alive_at=AT + timedelta(seconds=61))
        == []
    )


BEHAVIOURS: dict[str, Callable[[PlanStore], Awaitable[None]]] = {
    behaviour.__name__: behaviour
    for behaviour in (
        a_replica_gets_one_plan_per_trigger,
        recorded_plans_wait_to_be_published_oldest_first,
        a_plan_past_its_deadline_is_not_published_again,
    )
}
