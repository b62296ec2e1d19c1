"""The warmer's outbox: what waits for the broker's acknowledgement, in order, and at most one heartbeat a
replica.

Lifecycle events and warm results are few (a replica's state changes, its plans' results) and each one
counts: they wait in order until the broker acknowledges them, however long it is away. Heartbeats come from
every replica every interval, and one not yet sent says nothing the next will not: while one of a replica's
waits, a newer one is not queued. So an outage of the broker grows the outbox by the replicas' state changes,
not by its length (it grew by a heartbeat a replica an interval, for as long as the broker was away).
"""

from __future__ import annotations

import asyncio

from prometheus_client import Gauge

from warmplane.shared.events import Event, ReplicaHeartbeat


class Outbox:
    """Events waiting to be published: `put` and `beat` queue, `take` hands out the next ones in order, `done`
    says they were acknowledged, `join` waits until everything queued was."""

    def __init__(self, waiting: Gauge | None = None) -> None:
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._beating: set[str] = set()
        """Replicas with a heartbeat queued or being published."""
        self._waiting = waiting
        """Set to the events waiting (queued or being published), if given."""
        self._in_hand = 0
        """Events taken and not yet `done`."""

    def __len__(self) -> int:
        """Events waiting: queued or taken and not yet `done`."""
        return self._queue.qsize() + self._in_hand

    def put(self, event: Event) -> None:
        """Queue `event` behind everything queued before it."""
        self._queue.put_nowait(event)
        self._gauge()

    def beat(self, heartbeat: ReplicaHeartbeat) -> bool:
        """Queue `heartbeat` unless one of its replica's waits; whether it was queued."""
        if heartbeat.replica in self._beating:
            return False
        self._beating.add(heartbeat.replica)
        self.put(heartbeat)
        return True

    async def take(self, most: int) -> list[Event]:
        """The next events in order, at least one (waits for it) and at most `most`."""
        events = [await self._queue.get()]
        while not self._queue.empty() and len(events) < most:
            events.append(self._queue.get_nowait())
        self._in_hand += len(events)
        return events

    def done(self, events: list[Event]) -> None:
        """`events` (as `take` gave them) were acknowledged."""
        for event in events:
            if isinstance(event, ReplicaHeartbeat):
                self._beating.discard(event.replica)
            self._queue.task_done()
        self._in_hand -= len(events)
        self._gauge()

    async def join(self) -> None:
        """Until every event queued so far is `done`."""
        await self._queue.join()

    def _gauge(self) -> None:
        if self._waiting is not None:
            self._waiting.set(len(self))
