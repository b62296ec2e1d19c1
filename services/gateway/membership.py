"""Which replicas serve which model, and which of them are ready: the table the router reads.

`Membership` is what the router needs. `ReplicaTable` is its in-memory implementation, fed either by
configuration (`static_membership`, always ready) or by lifecycle events (`lifecycle_follower.py`).
Pure: no I/O and no clock; callers pass `now` in Unix seconds.

Contracts:
- Only a replica whose latest lifecycle event is `replica.became_ready` is ready. Any other lifecycle
  event of it (started, loading, warming, draining, crashed) takes it out; `replica.stopped` forgets it.
- `ready_at` is the ready event's occurrence time, so a gateway that restarts and replays the topic
  does not ramp long-ready replicas in again.
- `eject(replica, until)` leaves a replica out until `until` (a connection failed, it died mid-stream)
  or until it reports ready again, whichever comes first.
- A model is known while some replica not stopped serves it, ready or not.
- `seed(replica, ready, as_of)` sets a replica's state as the registry last saw it at `as_of`; lifecycle
  events of it that occurred before `as_of` are then ignored (a replayed topic must not roll it back).
- `ready(model, now)` changes only when `version` does or an ejection ends: not before
  `next_change(model, now)` while `version` stays. The router keeps a model's ring that long, so a
  request costs no walk over the fleet.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from warmplane.shared.events import Event, ReplicaBecameReady, ReplicaEvent, ReplicaStopped


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica as the gateway sees it: its name, base URL (the OpenAI API is under `/v1`), model."""

    name: str
    url: str
    model: str
    revision: str = ""
    ready_at: float = 0.0
    """When it turned ready, in Unix seconds (0: always was)."""


class Membership(Protocol):
    """The replicas a router may send a model's requests to."""

    version: int
    """Changes whenever the table does."""

    def ready(self, model: str, now: float) -> list[Replica]:
        """The ready replicas of `model`, not ejected at `now`, sorted by name."""

    def next_change(self, model: str, now: float) -> float:
        """When `ready(model, ...)` next changes on its own (an ejection ends): after `now`, or inf."""

    def serves(self, model: str) -> bool:
        """True while some replica serves `model`, ready or not."""

    def models(self) -> list[str]:
        """Every model some replica serves, sorted."""

    def eject(self, replica: str, until: float) -> None:
        """Leave `replica` out until `until` (Unix seconds) or until it reports ready again."""


@dataclass(slots=True)
class _Entry:
    replica: Replica
    ready: bool


class ReplicaTable:
    """The in-memory `Membership`: replicas by name, their readiness and ejections."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._ejected: dict[str, float] = {}
        self._as_of: dict[str, float] = {}
        self.version = 0

    def apply(self, event: Event) -> bool:
        """Fold one lifecycle event in; False for an event that is not about a replica."""
        if not isinstance(event, ReplicaEvent):
            return False
        name = event.replica
        if event.occurred_at.timestamp() < self._as_of.get(name, 0.0):
            return True
        self.version += 1
        if isinstance(event, ReplicaStopped):
            self._entries.pop(name, None)
            self._ejected.pop(name, None)
            return True
        known = self._entries.get(name)
        url = event.endpoint.rstrip("/") or (known.replica.url if known else "")
        ready = isinstance(event, ReplicaBecameReady) and bool(url)
        ready_at = event.occurred_at.timestamp() if ready else 0.0
        replica = Replica(name, url, event.model.name, event.model.revision, ready_at)
        self._entries[name] = _Entry(replica, ready)
        if ready:
            self._ejected.pop(name, None)
        return True

    def seed(self, replica: Replica, *, ready: bool, as_of: float) -> None:
        """Set `replica`'s state as the registry saw it at `as_of` (Unix seconds); a ready one keeps its
        `ready_at`, so it is not ramped in again."""
        self._entries[replica.name] = _Entry(dataclasses.replace(replica, url=replica.url.rstrip("/")), ready)
        self._as_of[replica.name] = as_of
        self.version += 1

    def add_ready(self, replica: Replica) -> None:
        """Declare `replica` ready (configuration, tests)."""
        replica = dataclasses.replace(replica, url=replica.url.rstrip("/"))
        self._entries[replica.name] = _Entry(replica, True)
        self._ejected.pop(replica.name, None)
        self.version += 1

    def ready(self, model: str, now: float) -> list[Replica]:
        chosen = [
            entry.replica
            for name, entry in self._entries.items()
            if entry.ready and entry.replica.model == model and self._ejected.get(name, 0.0) <= now
        ]
        return sorted(chosen, key=lambda replica: replica.name)

    def next_change(self, model: str, now: float) -> float:
        for name in [name for name, until in self._ejected.items() if until <= now]:
            del self._ejected[name]  # ended: as if never ejected (names come and go with autoscaling)
        ends = [
            until
            for name, until in self._ejected.items()
            if (entry := self._entries.get(name)) is not None and entry.replica.model == model
        ]
        return min(ends, default=math.inf)

    def serves(self, model: str) -> bool:
        return any(entry.replica.model == model for entry in self._entries.values())

    def models(self) -> list[str]:
        return sorted({entry.replica.model for entry in self._entries.values()})

    def eject(self, replica: str, until: float) -> None:
        if replica in self._entries:
            self._ejected[replica] = max(until, self._ejected.get(replica, 0.0))
            self.version += 1


def static_membership(replicas: Iterable[Replica]) -> ReplicaTable:
    """A table of `replicas`, all ready at full weight: for configuration without a lifecycle topic."""
    table = ReplicaTable()
    for replica in replicas:
        table.add_ready(replica)
    return table
