"""The warmer's outbox: events in order until acknowledged, and at most one heartbeat of a replica waiting,
so an outage of the broker grows it by state changes, not by its length."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, Gauge

from warmplane.services.warmer.outbox import Outbox
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import Event, ModelRef, ReplicaHeartbeat, ReplicaStarted

T0 = datetime(2026, 12, 6, tzinfo=UTC)


def beat(replica: str, second: int) -> ReplicaHeartbeat:
    return ReplicaHeartbeat(
        event_id=new_event_id(),
        occurred_at=T0 + timedelta(seconds=second),
        producer="warmer/n",
        model=ModelRef("m"),
        replica=replica,
        node="n",
        state="ready",
    )


def started(replica: str) -> ReplicaStarted:
    return ReplicaStarted(
        event_id=new_event_id(),
        occurred_at=T0,
        producer="warmer/n",
        model=ModelRef("m"),
        replica=replica,
        node="n",
    )


async def test_a_long_outage_keeps_every_state_change_in_order_and_one_heartbeat_a_replica() -> None:
    waiting = Gauge("outbox_events", "test", registry=CollectorRegistry())
    outbox = Outbox(waiting)
    a, b = started("r1"), started("r2")
    outbox.put(a)
    queued = [outbox.beat(beat(replica, second)) for second in range(100) for replica in ("r1", "r2")]
    outbox.put(b)
    assert queued.count(True) == 2 and len(outbox) == 4 and waiting._value.get() == 4

    events: list[Event] = await outbox.take(3)
    assert [type(e).__name__ for e in events] == ["ReplicaStarted", "ReplicaHeartbeat", "ReplicaHeartbeat"]
    assert events[0] is a and {e.occurred_at for e in events[1:]} == {T0}  # the first beats, not later ones
    assert not outbox.beat(beat("r1", 200))  # taken, not yet acknowledged: still waiting
    outbox.done(events)
    assert outbox.beat(beat("r1", 201))  # acknowledged: the next one queues
    rest = await outbox.take(10)
    assert rest[0] is b and [e.occurred_at for e in rest[1:]] == [T0 + timedelta(seconds=201)]
    outbox.done(rest)
    assert len(outbox) == 0 and waiting._value.get() == 0
    await asyncio.wait_for(outbox.join(), 5)
