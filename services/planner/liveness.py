"""Replicas that leave without a word: found by their stopped heartbeats, announced lost, and put back
when they speak again (the rules: `core/liveness.py`).

`LivenessWatch.sweep` runs every heartbeat interval: it reads who should be heard and when each was, and
publishes `replica.lost` for the silent ones on the lifecycle topic. It records nothing itself: the
planner's ingestion records the event as any stop, gateways stop routing to the replica, and the fleet
reactions plan the ready replicas for the keys it leaves. A replica is announced once per silence by this
planner; several planners may each announce it (consumers take a second stop as the first). `heard`
runs after each committed batch: a replica recorded gone whose warmer still serves it as ready (cut off
from the broker, not lost) is announced ready again on its behalf.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Protocol

from warmplane.services.planner.core.liveness import Heard, returned, silent
from warmplane.services.planner.fleet_reactions import EventPublisher
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, ReplicaBecameReady, ReplicaHeartbeat, ReplicaLost
from warmplane.shared.settings import HeartbeatSettings

log = logging.getLogger(__name__)
PRODUCER = "planner"


class LivenessStore(Protocol):
    """What the watch reads (`pg_liveness.PgLivenessStore` is the real one)."""

    async def heard_replicas(self) -> list[Heard]: ...
    async def gone_among(self, replicas: Sequence[str]) -> list[tuple[Heard, datetime]]: ...


class LivenessWatch:
    def __init__(
        self,
        *,
        store: LivenessStore,
        publisher: EventPublisher,
        settings: HeartbeatSettings,
        metrics: PlannerMetrics,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._announced: dict[str, datetime | None] = {}
        """Replica -> the last-heard moment it was announced lost for (one announcement per silence)."""

    async def sweep(self) -> list[ReplicaLost]:
        """Announce the replicas silent now (module doc); the events published. Raises what the store and
        the publisher raise (the next sweep tries again)."""
        now = self._clock()
        fleet = await self._store.heard_replicas()
        present = {replica.replica for replica in fleet}
        self._announced = {name: at for name, at in self._announced.items() if name in present}
        lost = []
        for replica in silent(fleet, now, self._settings.timeout_s):
            if replica.replica in self._announced and self._announced[replica.replica] == replica.heard_at:
                continue
            assert replica.heard_at is not None  # `silent` judges only replicas heard before
            quiet_s = (now - replica.heard_at).total_seconds()
            event = ReplicaLost(
                event_id=new_event_id(),
                occurred_at=now,
                producer=PRODUCER,
                model=ModelRef(replica.model, replica.model_revision),
                replica=replica.replica,
                node=replica.node,
                endpoint=replica.endpoint,
                reason=f"lost: not heard for {quiet_s:.0f} s while the rest of the fleet was",
            )
            await self._publisher.publish(event)
            self._announced[replica.replica] = replica.heard_at
            self._metrics.replica_liveness.labels("lost").inc()
            log.warning("replica %s on node %s is lost: %s", replica.replica, replica.node, event.reason)
            lost.append(event)
        return lost

    async def heard(self, beats: Mapping[str, ReplicaHeartbeat]) -> list[ReplicaBecameReady]:
        """Put back the replicas of `beats` recorded gone that still serve as ready (module doc); the
        events published. Never raises: a failure is logged, and the next heartbeat tries again."""
        if not beats:
            return []
        for name in beats:
            self._announced.pop(name, None)
        back = []
        try:
            for replica, gone_since in await self._store.gone_among(sorted(beats)):
                beat = beats[replica.replica]
                if not returned(beat.occurred_at, beat.state, gone_since):
                    continue
                event = ReplicaBecameReady(
                    event_id=new_event_id(),
                    occurred_at=self._clock(),
                    producer=PRODUCER,
                    model=ModelRef(replica.model, replica.model_revision),
                    replica=replica.replica,
                    node=replica.node,
                    endpoint=replica.endpoint,
                    reason="heard again after it was marked gone: its warmer still serves it as ready",
                )
                await self._publisher.publish(event)
                self._metrics.replica_liveness.labels("returned").inc()
                log.warning("replica %s on node %s is back: %s", replica.replica, replica.node, event.reason)
                back.append(event)
        except Exception:  # a reaction must not stop ingestion
            self._metrics.plan_failures.inc()
            log.exception("could not put back replicas heard again")
        return back

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self._settings.interval_s)
            try:
                await self.sweep()
            except Exception:  # the database or the broker away: the next sweep tries again
                log.warning("liveness sweep failed; retrying next interval", exc_info=True)
