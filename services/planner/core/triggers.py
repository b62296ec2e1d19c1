"""What a committed batch asks the planning task (`planning.py`) to do: one trigger type per kind of work,
and how two waiting triggers of one key merge into one (pure: no I/O, no clock).

| trigger | made from | key | merged with a newer one of its key |
|---|---|---|---|
| `StartsToPlan` | `replica.started` | model | the starts of both: one fleet pass plans them all |
| `BumpToPlan` | `epoch.bumped` | (tenant, model) | the higher epoch stands (the newer on a tie) |
| `DeployToApply` | `deploy.started`, `deploy.finished` | the event | a redelivered copy: the first stands |
| `ReadyToReplan` | `fleet.scaled` down, `replica.draining_started`, `replica.lost` | model | the first's id |
| `RewarmToPlan` | `replica.rewarm_requested` | replica | the first stands |
| `HeartbeatsHeard` | `replica.heartbeat` | one | each replica's newest beat |
| `OutcomesReported` | `warm.finished` | one | the results of both |
| `RequestsCounted` | request counts, for the cold-start alarm | one | summed per (model, bucket) |
| `CountsToAbsorb` | request counts, a kept read absorbing or due (`kept_reads.py`) | one | one stands |

A merge is safe because a trigger's handler reads what it plans from (counts, epochs, live replicas) when it
runs, after every batch merged into it committed: the pass made for the first trigger of a key is the one the
second would have made. A `fleet.scaled` up makes no trigger: a ready replica only loses keys to the
newcomers, whose own starts plan them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from warmplane.services.planner.core.cold_start import model_bucket_counts
from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.shared.events import (
    DeployFinished,
    DeployStarted,
    EpochBumped,
    Event,
    FleetScaled,
    ReplicaDrainingStarted,
    ReplicaHeartbeat,
    ReplicaLost,
    ReplicaRewarmRequested,
    ReplicaStarted,
    WarmFinished,
)


@dataclass(frozen=True, slots=True)
class StartsToPlan:
    """Replicas of `model` that started; `committed_at` (monotonic seconds): when the newest of their
    batches had committed, so a read of the counts begun after it holds everything they were counted
    with."""

    model: str
    starts: tuple[ReplicaStarted, ...]
    committed_at: float

    @property
    def key(self) -> Hashable:
        return (StartsToPlan, self.model)

    def merged(self, newer: StartsToPlan) -> StartsToPlan:
        known = {start.event_id for start in self.starts}
        fresh = tuple(start for start in newer.starts if start.event_id not in known)
        return StartsToPlan(self.model, self.starts + fresh, max(self.committed_at, newer.committed_at))


@dataclass(frozen=True, slots=True)
class BumpToPlan:
    """A new epoch of (tenant, model) to plan on every live replica. Of two bumps, the higher epoch's plans
    serve: the re-plan reads the tenant's current epoch, so the older bump's would be the same plans."""

    bump: EpochBumped

    @property
    def key(self) -> Hashable:
        return (BumpToPlan, self.bump.tenant, self.bump.model.name)

    def merged(self, newer: BumpToPlan) -> BumpToPlan:
        return newer if newer.bump.epoch >= self.bump.epoch else self


@dataclass(frozen=True, slots=True)
class DeployToApply:
    """A deploy whose stale epochs are to be bumped, published and planned."""

    deploy: DeployStarted | DeployFinished

    @property
    def key(self) -> Hashable:
        return (DeployToApply, self.deploy.event_id)

    def merged(self, newer: DeployToApply) -> DeployToApply:
        return self


@dataclass(frozen=True, slots=True)
class ReadyToReplan:
    """The ready replicas of `model` take keys from replicas leaving (`trigger`, the event, names their
    plans; `why` says what left, for the log)."""

    model: str
    trigger: Event
    why: str

    @property
    def key(self) -> Hashable:
        return (ReadyToReplan, self.model)

    def merged(self, newer: ReadyToReplan) -> ReadyToReplan:
        return ReadyToReplan(self.model, self.trigger, f"{self.why}; {newer.why}")


@dataclass(frozen=True, slots=True)
class RewarmToPlan:
    """A requested re-warm of one replica in full."""

    request: ReplicaRewarmRequested

    @property
    def key(self) -> Hashable:
        return (RewarmToPlan, self.request.replica)

    def merged(self, newer: RewarmToPlan) -> RewarmToPlan:
        return self


@dataclass(frozen=True, slots=True)
class HeartbeatsHeard:
    """Each replica's newest heartbeat, for the liveness watch."""

    beats: dict[str, ReplicaHeartbeat]

    @property
    def key(self) -> Hashable:
        return HeartbeatsHeard

    def merged(self, newer: HeartbeatsHeard) -> HeartbeatsHeard:
        beats = dict(self.beats)
        for replica, beat in newer.beats.items():
            if replica not in beats or beats[replica].occurred_at < beat.occurred_at:
                beats[replica] = beat
        return HeartbeatsHeard(beats)


@dataclass(frozen=True, slots=True)
class OutcomesReported:
    """Warm results whose plans' outcomes are to be counted."""

    results: tuple[WarmFinished, ...]

    @property
    def key(self) -> Hashable:
        return OutcomesReported

    def merged(self, newer: OutcomesReported) -> OutcomesReported:
        return OutcomesReported(self.results + newer.results)


@dataclass(frozen=True, slots=True)
class RequestsCounted:
    """Requests and cold ones per (model, bucket), for the cold-start alarm, in the order first seen."""

    counts: dict[tuple[str, int], tuple[int, int]]

    @property
    def key(self) -> Hashable:
        return RequestsCounted

    def merged(self, newer: RequestsCounted) -> RequestsCounted:
        counts = dict(self.counts)
        for at, (requests, cold) in newer.counts.items():
            before = counts.get(at, (0, 0))
            counts[at] = (before[0] + requests, before[1] + cold)
        return RequestsCounted(counts)


@dataclass(frozen=True, slots=True)
class CountsToAbsorb:
    """Batches committed that kept reads have yet to absorb: absorbed while the planning task is free, a
    start absorbs only what came after (`kept_reads.py`); kept reads due to be read again are then started
    on that, beside the planning task. Made by the writer's hook, which knows whether a read absorbs or is
    due; it says nothing of which batches (the handler takes all that wait)."""

    @property
    def key(self) -> Hashable:
        return CountsToAbsorb

    def merged(self, newer: CountsToAbsorb) -> CountsToAbsorb:
        return self


Trigger = (
    StartsToPlan
    | BumpToPlan
    | DeployToApply
    | ReadyToReplan
    | RewarmToPlan
    | HeartbeatsHeard
    | OutcomesReported
    | RequestsCounted
    | CountsToAbsorb
)


def _scaled(event: Any, committed_at: float) -> Trigger | None:
    scaled: FleetScaled = event
    if scaled.to_replicas >= scaled.from_replicas:
        return None
    why = f"scaled from {scaled.from_replicas} to {scaled.to_replicas} replicas"
    return ReadyToReplan(scaled.model.name, scaled, why)


_FROM_EVENT: dict[type[Event], Callable[[Any, float], Trigger | None]] = {
    ReplicaStarted: lambda e, at: StartsToPlan(e.model.name, (e,), at),
    EpochBumped: lambda e, at: BumpToPlan(e),
    DeployStarted: lambda e, at: DeployToApply(e),
    DeployFinished: lambda e, at: DeployToApply(e),
    FleetScaled: _scaled,
    ReplicaDrainingStarted: lambda e, at: ReadyToReplan(e.model.name, e, f"{e.replica} is draining"),
    ReplicaLost: lambda e, at: ReadyToReplan(e.model.name, e, f"{e.replica} is lost"),
    ReplicaRewarmRequested: lambda e, at: RewarmToPlan(e),
}
"""The trigger each event type makes (events of other types make none)."""


def triggers_of(batch: IngestBatch, committed_at: float, *, bucket_seconds: int | None) -> list[Trigger]:
    """What committed `batch` triggers, merged where keys meet, in the batch's order: outcomes, replica
    events, heartbeats, fleet changes, then request counts (only with a `bucket_seconds` to count them
    in). `committed_at`: monotonic seconds after the batch committed."""
    made: dict[Hashable, Trigger] = {}

    def add(trigger: Trigger | None) -> None:
        if trigger is not None:
            waiting = made.get(trigger.key)
            made[trigger.key] = trigger if waiting is None else waiting.merged(trigger)  # type: ignore[arg-type]

    finished = tuple(result for result in batch.plan_results if type(result) is WarmFinished)
    add(OutcomesReported(finished) if finished else None)
    for replica_event in batch.replica_events:
        add(_made(replica_event, committed_at))
    add(HeartbeatsHeard(dict(batch.heartbeats)) if batch.heartbeats else None)
    for change in batch.fleet_changes:
        add(_made(change, committed_at))
    if bucket_seconds is not None and batch.requests.seconds:
        counts = model_bucket_counts(batch.requests, bucket_seconds)
        add(RequestsCounted({(model, bucket): (n, cold) for model, bucket, n, cold in counts}))
    return list(made.values())


def _made(event: Event, committed_at: float) -> Trigger | None:
    make = _FROM_EVENT.get(type(event))
    return None if make is None else make(event, committed_at)
