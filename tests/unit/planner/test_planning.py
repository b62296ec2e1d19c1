"""The planning task with fakes: dispatch by trigger type, coalescing of waiting triggers, what a full queue
does (the writer waits; nothing is dropped), failures and shutdown; what a batch triggers; and that a start
never shares a read of the counts begun before its batch committed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import timedelta

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from tests.unit.planner.memory_planner import BUCKET, MODEL, NOW, MemoryPlans, Published
from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.core.triggers import (
    BumpToPlan,
    HeartbeatsHeard,
    ReadyToReplan,
    StartsToPlan,
    triggers_of,
)
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.plan_choice import LiveReplica
from warmplane.services.planner.planning import Handler, Planning
from warmplane.services.planner.plans import PlanIssuer
from warmplane.services.planner.settings import PlanSettings
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    EpochBumped,
    FleetScaled,
    ModelRef,
    PrefixPayload,
    ReplicaDrainingStarted,
    ReplicaHeartbeat,
    ReplicaStarted,
)


@dataclass(frozen=True)
class Note:
    """A fake trigger: notes of one `topic` merge, their words joined."""

    topic: str
    words: tuple[str, ...]

    @property
    def key(self) -> Hashable:
        return self.topic

    def merged(self, newer: Note) -> Note:
        return Note(self.topic, self.words + newer.words)


@dataclass(frozen=True)
class Alarm:
    """Another fake trigger type, never merged."""

    name: str

    @property
    def key(self) -> Hashable:
        return (Alarm, self.name)

    def merged(self, newer: Alarm) -> Alarm:
        return self


class Recorder:
    """Handlers that note what they were given; a note held by `gate` waits for it."""

    def __init__(self) -> None:
        self.seen: list[object] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def note(self, note: Note) -> None:
        self.entered.set()
        await self.gate.wait()
        self.seen.append(note)

    async def alarm(self, alarm: Alarm) -> None:
        if alarm.name == "broken":
            raise OSError("connection reset")
        self.seen.append(alarm)


def planning(recorder: Recorder, depth: int = 8, yield_s: float = 0.0) -> tuple[Planning, PlannerMetrics]:
    """Planning over `recorder`'s handlers; notes are urgent (ingestion yields to them), alarms are not."""
    metrics = PlannerMetrics(CollectorRegistry())
    handlers: dict[type, Handler] = {Note: recorder.note, Alarm: recorder.alarm}
    return Planning(handlers, depth=depth, metrics=metrics, urgent={Note}, yield_s=yield_s), metrics


async def test_each_trigger_goes_to_its_type_s_handler_in_order_and_waiting_ones_of_a_key_merge() -> None:
    recorder = Recorder()
    queue, _ = planning(recorder)
    await queue.put([Note("m1", ("a",)), Alarm("x"), Note("m2", ("b",)), Note("m1", ("c",))])
    assert len(queue) == 3
    assert await queue.burst() == 3
    assert recorder.seen == [Note("m1", ("a", "c")), Alarm("x"), Note("m2", ("b",))]


async def test_a_trigger_type_without_a_handler_is_refused() -> None:
    queue, _ = planning(Recorder())
    with pytest.raises(LookupError, match="StartsToPlan"):
        await queue.put([StartsToPlan("m", (), 0.0)])


async def test_a_full_queue_holds_the_writer_back_until_the_task_takes_a_trigger_and_merges_do_not_wait() -> (
    None
):
    recorder = Recorder()
    recorder.gate.clear()
    queue, _ = planning(recorder, depth=1)
    queue.start()
    await queue.put([Note("m1", ("a",))])
    await asyncio.wait_for(recorder.entered.wait(), 5)  # taken: the task is inside its handler
    await queue.put([Note("m2", ("b",))])  # fills the queue
    await asyncio.wait_for(queue.put([Note("m2", ("c",))]), 5)  # merges: no room needed
    blocked = asyncio.create_task(queue.put([Note("m3", ("d",))]))
    await asyncio.sleep(0.05)
    assert not blocked.done() and len(queue) == 1  # a new key waits for room; nothing is dropped
    recorder.gate.set()
    await asyncio.wait_for(blocked, 5)
    await queue.drain(5)
    assert recorder.seen == [Note("m1", ("a",)), Note("m2", ("b", "c")), Note("m3", ("d",))]


async def test_a_trigger_taken_is_not_merged_into_any_more() -> None:
    """A trigger put while one of its key is handled waits for a pass of its own, which reads after it."""
    recorder = Recorder()
    recorder.gate.clear()
    queue, _ = planning(recorder)
    queue.start()
    await queue.put([Note("m1", ("a",))])
    await asyncio.wait_for(recorder.entered.wait(), 5)
    await queue.put([Note("m1", ("b",))])
    recorder.gate.set()
    await queue.drain(5)
    assert recorder.seen == [Note("m1", ("a",)), Note("m1", ("b",))]


async def test_a_failing_handler_is_counted_and_the_next_trigger_handled() -> None:
    recorder = Recorder()
    queue, metrics = planning(recorder)
    queue.start()
    await queue.put([Alarm("broken"), Alarm("fine")])
    await queue.drain(5)
    assert recorder.seen == [Alarm("fine")]
    assert metrics.plan_failures._value.get() == 1


async def test_drain_handles_what_waits_then_stops_and_a_stuck_handler_is_cancelled_at_its_deadline() -> None:
    recorder = Recorder()
    queue, _ = planning(recorder)
    queue.start()
    await queue.put([Note("m1", ("a",)), Note("m2", ("b",))])
    await queue.drain(5)
    assert [n.topic for n in recorder.seen if isinstance(n, Note)] == ["m1", "m2"]

    stuck = Recorder()
    stuck.gate.clear()
    queue, _ = planning(stuck)
    queue.start()
    await queue.put([Note("m1", ("a",))])
    started = time.monotonic()
    await asyncio.wait_for(queue.drain(0.2), 5)
    assert time.monotonic() - started < 2 and stuck.seen == []


async def test_ingestion_yields_while_an_urgent_trigger_waits_or_is_handled_never_for_the_others() -> None:
    recorder = Recorder()
    recorder.gate.clear()
    queue, metrics = planning(recorder, yield_s=30)
    await queue.put([Alarm("fine")])
    assert await asyncio.wait_for(queue.yield_to_urgent(), 5) == 0.0  # an alarm waits: nobody waits on it
    await queue.put([Note("m1", ("a",)), Note("m1", ("b",))])  # merged: one urgent trigger
    queue.start()
    await asyncio.wait_for(recorder.entered.wait(), 5)
    paused = asyncio.create_task(queue.yield_to_urgent())
    await asyncio.sleep(0.05)
    assert not paused.done()  # the note is being handled: ingestion waits
    recorder.gate.set()
    assert 0 < await asyncio.wait_for(paused, 5) < 30
    assert metrics.ingest_yielded_seconds._value.get() > 0
    await queue.drain(5)
    assert recorder.seen == [Alarm("fine"), Note("m1", ("a", "b"))]
    assert await queue.yield_to_urgent() == 0.0  # handled: nothing urgent is left


async def test_a_pause_lasts_at_most_yield_s_and_ingestion_then_runs_as_long_before_it_yields_again() -> None:
    recorder = Recorder()
    recorder.gate.clear()
    queue, _ = planning(recorder, yield_s=0.05)
    queue.start()
    await queue.put([Note("m1", ("a",))])
    await asyncio.wait_for(recorder.entered.wait(), 5)
    assert 0.04 < await asyncio.wait_for(queue.yield_to_urgent(), 5) < 5
    assert await queue.yield_to_urgent() == 0.0  # still urgent, but ingestion has its turn first
    recorder.gate.set()
    await queue.drain(5)

    never, _ = planning(Recorder(), yield_s=0.0)
    await never.put([Note("m1", ("a",))])
    assert await never.yield_to_urgent() == 0.0  # 0: ingestion never yields


def started(replica: str, model: str = "m") -> ReplicaStarted:
    return ReplicaStarted(
        event_id=new_event_id(),
        occurred_at=NOW,
        producer="w",
        model=ModelRef(model),
        replica=replica,
        node="n",
    )


def bump(epoch: int, tenant: str = "t") -> EpochBumped:
    return EpochBumped(
        event_id=new_event_id(), occurred_at=NOW, producer="api", tenant=tenant, model=MODEL, epoch=epoch
    )


def test_a_batch_triggers_one_pass_per_model_s_starts_and_nothing_for_a_scale_up() -> None:
    a, b, c = started("a"), started("b"), started("c", model="other")
    up = FleetScaled(
        event_id=new_event_id(), occurred_at=NOW, producer="k8s", model=MODEL, from_replicas=1, to_replicas=3
    )
    down = msgspec.structs.replace(up, event_id=new_event_id(), from_replicas=3, to_replicas=2)
    drain = ReplicaDrainingStarted(
        event_id=new_event_id(), occurred_at=NOW, producer="w", model=MODEL, replica="s", node="n"
    )
    beat = ReplicaHeartbeat(
        event_id=new_event_id(),
        occurred_at=NOW,
        producer="w",
        model=MODEL,
        replica="a",
        node="n",
        state="ready",
    )
    batch = IngestBatch(
        replica_events=[a, drain, b, c, a], fleet_changes=[up, down, bump(2), bump(3)], heartbeats={"a": beat}
    )
    made = triggers_of(batch, 7.0, bucket_seconds=None)
    assert made == [
        StartsToPlan("m", (a, b), 7.0),
        ReadyToReplan(MODEL.name, drain, "s is draining; scaled from 3 to 2 replicas"),
        StartsToPlan("other", (c,), 7.0),
        HeartbeatsHeard({"a": beat}),
        BumpToPlan(batch.fleet_changes[3]),  # type: ignore[arg-type]
    ]


def test_a_bump_supersedes_an_older_one_of_its_tenant_and_model_only() -> None:
    two, three = BumpToPlan(bump(2)), BumpToPlan(bump(3))
    assert two.merged(three) == three and three.merged(two) == three
    assert two.key != BumpToPlan(bump(2, tenant="other")).key


def test_merged_starts_wait_for_a_read_begun_after_the_newest_of_their_batches() -> None:
    first, second = StartsToPlan("m", (started("a"),), 1.0), StartsToPlan("m", (started("b"),), 2.0)
    merged = first.merged(second).merged(first)
    assert [s.replica for s in merged.starts] == ["a", "b"] and merged.committed_at == 2.0


def test_a_start_never_shares_a_read_begun_before_its_batch_committed() -> None:
    """The read kept for starts within `statistics_max_age_s` serves only starts whose batches had committed
    before it began: counts older than the triggering batch are never planned from."""
    store = MemoryPlans([(1, 5, None, 100)], [(1, 5, BUCKET, 30)], {(1, 5): PrefixPayload(5, prompt="hello")})
    store.live = [LiveReplica(r, "n", MODEL.revision, "starting", None) for r in "abc"]
    issuer = PlanIssuer(
        store=store,
        publisher=Published(),
        settings=PlanSettings(statistics_max_age_s=60, min_expected_saved_tokens=0),
        bucket_seconds=60,
        metrics=PlannerMetrics(CollectorRegistry()),
        clock=lambda: NOW + timedelta(seconds=1),
    )
    before = time.monotonic()
    asyncio.run(issuer.issue(started("a"), committed_at=before))
    after_first_read = time.monotonic()
    asyncio.run(issuer.issue(started("b"), committed_at=after_first_read))
    assert len(store.asked) == 2  # b's batch committed after the first read began: read again
    asyncio.run(issuer.issue(started("c"), committed_at=before))
    assert len(store.asked) == 2  # c's had committed before the second read: it will do
