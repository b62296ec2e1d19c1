"""Replica liveness: the rule that marks a silent replica lost (`core/liveness.py`), the planner's watch that
announces it and puts back one heard again (`liveness.py`), heartbeats in a batch, in a warmer's phases,
and at a gateway."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from tests.unit.planner.memory_planner import MODEL, NOW, Published
from warmplane.services.gateway.membership import ReplicaTable
from warmplane.services.planner.core.ingest_batch import fold_events
from warmplane.services.planner.core.liveness import Heard, returned, silent
from warmplane.services.planner.liveness import LivenessWatch
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.shared.events import ReplicaBecameReady, ReplicaHeartbeat, ReplicaLost, ReplicaState
from warmplane.shared.settings import HeartbeatSettings

TIMEOUT_S = 30.0


def heard(name: str, seconds_ago: float | None) -> Heard:
    at = None if seconds_ago is None else NOW - timedelta(seconds=seconds_ago)
    return Heard(name, f"node-{name}", MODEL.name, MODEL.revision, f"http://{name}:8000", at)


def beat(name: str, at: datetime, state: ReplicaState = "ready") -> ReplicaHeartbeat:
    return ReplicaHeartbeat(
        event_id=uuid.uuid4(),
        occurred_at=at,
        producer=f"warmer/node-{name}",
        model=MODEL,
        replica=name,
        node=f"node-{name}",
        state=state,
    )


def test_a_replica_silent_while_the_rest_of_the_fleet_is_heard_is_lost() -> None:
    fleet = [heard("a", 1), heard("b", 2), heard("c", 32)]
    assert [r.replica for r in silent(fleet, NOW, TIMEOUT_S)] == ["c"]
    assert silent([heard("a", 1), heard("c", 29)], NOW, TIMEOUT_S) == []


def test_a_fleet_silent_together_or_of_one_is_not_judged() -> None:
    """The broker or the planner away looks like every replica silent at once: nobody is lost."""
    assert silent([heard("a", 300), heard("b", 305)], NOW, TIMEOUT_S) == []
    assert silent([heard("a", 3_600)], NOW, TIMEOUT_S) == []
    assert silent([], NOW, TIMEOUT_S) == []
    assert silent([heard("a", None), heard("b", None)], NOW, TIMEOUT_S) == []


def test_a_warmer_clock_ahead_of_the_planners_does_not_make_the_rest_lost() -> None:
    """The cut is behind `now` as well as behind the newest heartbeat."""
    assert silent([heard("a", -600), heard("b", 10)], NOW, TIMEOUT_S) == []


@given(st.lists(st.one_of(st.none(), st.floats(-100, 10_000)), max_size=12), st.floats(1, 600))
def test_whoever_is_lost_was_silent_a_timeout_behind_both_now_and_the_newest(
    ages: list[float | None], timeout_s: float
) -> None:
    fleet = [heard(f"r{i}", age) for i, age in enumerate(ages)]
    lost = silent(fleet, NOW, timeout_s)
    known = [r.heard_at for r in fleet if r.heard_at is not None]
    for replica in lost:
        assert replica.heard_at is not None
        assert replica.heard_at < NOW - timedelta(seconds=timeout_s)
        assert replica.heard_at < max(known) - timedelta(seconds=timeout_s)
    assert len(lost) < max(1, len(known))  # the newest is never lost


def test_only_a_heartbeat_after_the_loss_from_a_ready_replica_puts_it_back() -> None:
    assert returned(NOW, "ready", NOW - timedelta(seconds=5))
    assert not returned(NOW - timedelta(seconds=10), "ready", NOW - timedelta(seconds=5))
    assert not returned(NOW, "warming", NOW - timedelta(seconds=5))


class MemoryLiveness:
    """The registry's replicas: those heard, and those recorded gone with since when."""

    def __init__(self, fleet: Sequence[Heard]) -> None:
        self.fleet = list(fleet)
        self.gone: dict[str, tuple[Heard, datetime]] = {}

    async def heard_replicas(self) -> list[Heard]:
        return list(self.fleet)

    async def gone_among(self, replicas: Sequence[str]) -> list[tuple[Heard, datetime]]:
        return [self.gone[name] for name in replicas if name in self.gone]


def watch(store: MemoryLiveness, published: Published) -> tuple[LivenessWatch, PlannerMetrics]:
    metrics = PlannerMetrics(CollectorRegistry())
    settings = HeartbeatSettings(interval_s=10, missed=3)
    return LivenessWatch(
        store=store, publisher=published, settings=settings, metrics=metrics, clock=lambda: NOW
    ), metrics


def _count(metrics: PlannerMetrics, change: str) -> float:
    return float(metrics.replica_liveness.labels(change)._value.get())


async def test_a_silent_replica_is_announced_lost_once_per_silence() -> None:
    store, published = MemoryLiveness([heard("a", 1), heard("b", 45)]), Published()
    liveness, metrics = watch(store, published)
    [lost] = await liveness.sweep()
    assert isinstance(lost, ReplicaLost) and published.events == [lost]
    assert (lost.replica, lost.node, lost.endpoint, lost.producer) == (
        "b",
        "node-b",
        "http://b:8000",
        "planner",
    )
    assert lost.reason == "lost: not heard for 45 s while the rest of the fleet was"
    assert await liveness.sweep() == []  # not yet recorded gone: still in the fleet, not announced again
    assert _count(metrics, "lost") == 1
    store.fleet = [heard("a", 1), heard("b", 45)]
    await liveness.heard({"b": beat("b", NOW - timedelta(seconds=45))})  # b spoke: a new silence may follow
    assert len(await liveness.sweep()) == 1


async def test_a_replica_gone_whose_warmer_still_serves_it_as_ready_is_put_back() -> None:
    store, published = MemoryLiveness([heard("a", 1)]), Published()
    liveness, metrics = watch(store, published)
    gone_since = NOW - timedelta(seconds=20)
    store.gone = {"b": (heard("b", 50), gone_since), "c": (heard("c", 50), gone_since)}
    back = await liveness.heard(
        {
            "a": beat("a", NOW),  # not gone: nothing to do
            "b": beat("b", NOW),  # heard after its loss, ready: back
            "c": beat("c", gone_since - timedelta(seconds=1)),  # sent before the loss: stays gone
        }
    )
    [event] = back
    assert isinstance(event, ReplicaBecameReady) and published.events == back
    assert (event.replica, event.endpoint, event.producer) == ("b", "http://b:8000", "planner")
    assert _count(metrics, "returned") == 1


async def test_putting_back_never_raises() -> None:
    published = Published()
    published.down = True
    store = MemoryLiveness([])
    store.gone = {"b": (heard("b", 50), NOW - timedelta(seconds=20))}
    liveness, metrics = watch(store, published)
    assert await liveness.heard({"b": beat("b", NOW)}) == []
    assert metrics.plan_failures._value.get() == 1


def test_a_batch_keeps_each_replicas_newest_heartbeat() -> None:
    beats = [beat("a", NOW), beat("a", NOW + timedelta(seconds=10)), beat("b", NOW), beat("a", NOW)]
    batch = fold_events(beats, stored_nodes={})
    assert {name: b.occurred_at for name, b in batch.heartbeats.items()} == {
        "a": NOW + timedelta(seconds=10),
        "b": NOW,
    }
    assert batch.has_records and batch.replica_events == []


def test_a_gateway_stops_routing_to_a_lost_replica_and_ignores_heartbeats() -> None:
    table = ReplicaTable()
    ready = ReplicaBecameReady(
        event_id=uuid.uuid4(),
        occurred_at=NOW,
        producer="warmer/node-a",
        model=MODEL,
        replica="a",
        node="node-a",
        endpoint="http://a:8000",
    )
    table.apply(ready)
    assert not table.apply(beat("a", NOW + timedelta(seconds=1)))
    assert [r.name for r in table.ready(MODEL.name, NOW.timestamp() + 100)] == ["a"]
    lost = ReplicaLost(
        event_id=uuid.uuid4(),
        occurred_at=NOW + timedelta(seconds=40),
        producer="planner",
        model=MODEL,
        replica="a",
        node="node-a",
    )
    table.apply(lost)
    assert table.ready(MODEL.name, NOW.timestamp() + 100) == []
