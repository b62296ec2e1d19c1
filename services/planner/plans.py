"""Issuing warm plans: after a batch holding `replica.started` events commits, plan each new replica.

For each starting replica: choose the model's most valuable catalogued prefixes under the budget
(`core.simple_plan`), record the plan in Postgres (unique on the triggering event, so a redelivered
`replica.started` issues nothing), and only when the row was inserted publish `WarmPlanIssued` to the
plans topic, keyed by node.

Delivery: a plan is recorded before it is published. If publishing fails the row stays `issued` and the
failure is logged; re-publishing issued plans is left to later at-least-once work (the row holds all a
re-publish needs, and the plan's event id is its plan id, so consumers see a re-publish as a duplicate).
A planner that crashes between a batch's commit and its plans issues none for that batch's replicas:
the same later work (replicas `starting` without a plan) must cover it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

import msgspec

from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.core.simple_plan import Candidate, NodeKey, choose_warm_set
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.settings import PlanSettings
from warmplane.shared.codec import DEFAULT_MAX_EVENT_BYTES
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import PrefixPayload, ReplicaStarted, WarmItem, WarmPlanIssued

log = logging.getLogger(__name__)
_ENVELOPE_BYTES = 4_096
"""Room a plan's fields other than its items take, with margin (names are at most 128 characters)."""


class PlanStore(Protocol):
    """What issuing needs of the database (`pg_plans.PgPlanStore` is the real one)."""

    async def candidates(self, model: str, since_bucket: int) -> list[Candidate]: ...
    async def payloads(self, keys: Sequence[NodeKey]) -> dict[NodeKey, PrefixPayload]: ...
    async def scope_names(self, scope_ids: Sequence[int]) -> dict[int, tuple[str, str]]: ...
    async def planned(self, trigger_event_id: uuid.UUID) -> bool: ...
    async def record(self, plan: WarmPlanIssued, trigger_event_id: uuid.UUID) -> bool: ...


class PlanPublisher(Protocol):
    """Where plans go (`shared.event_publisher.KafkaEventPublisher` is the real one: to the plans topic,
    keyed by node)."""

    async def publish(self, event: WarmPlanIssued) -> None:
        """Return once the broker acknowledged `event`; raise if it did not in time."""


class PlanIssuer:
    """Plans starting replicas. `after_commit` is the ingestor's hook; `issue` plans one replica."""

    def __init__(
        self,
        *,
        store: PlanStore,
        publisher: PlanPublisher,
        settings: PlanSettings,
        bucket_seconds: int,
        metrics: PlannerMetrics,
        max_plan_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._settings = settings
        self._bucket_seconds = bucket_seconds
        self._metrics = metrics
        self._max_plan_bytes = max_plan_bytes
        self._clock = clock

    async def after_commit(self, batch: IngestBatch) -> None:
        """Plan every replica that `batch` (already committed) reports starting. Never raises: the batch's
        counts stand whatever happens to its plans, and a failure is logged and counted."""
        for event in batch.replica_events:
            if isinstance(event, ReplicaStarted):
                try:
                    await self.issue(event)
                except Exception:  # a plan must not stop ingestion; later work re-plans (module doc)
                    self._metrics.plan_failures.inc()
                    log.exception("could not plan replica %s (event %s)", event.replica, event.event_id)

    async def issue(self, started: ReplicaStarted) -> WarmPlanIssued | None:
        """Choose, record and publish the plan `started` triggers; None if one was already recorded.

        Returns the plan once recorded, even if publishing it failed (logged, counted). Raises what the
        store raises (asyncpg and OS errors) before anything is recorded.
        """
        if await self._store.planned(started.event_id):
            return None
        plan = await self._choose(started)
        if not await self._store.record(plan, started.event_id):
            return None  # a concurrent planner recorded it first
        try:
            await self._publisher.publish(plan)
        except Exception:
            self._metrics.plan_failures.inc()
            log.exception("plan %s is recorded but not published; it stays 'issued'", plan.plan_id)
            return plan
        self._metrics.plans_issued.inc()
        log.info(
            "issued plan %s for replica %s on %s: %d items, %d tokens",
            plan.plan_id,
            plan.replica,
            plan.node,
            len(plan.items),
            sum(item.tokens for item in plan.items),
        )
        return plan

    async def _choose(self, started: ReplicaStarted) -> WarmPlanIssued:
        settings = self._settings
        now = self._clock()
        since = now - timedelta(hours=settings.window_hours)
        offered = await self._store.candidates(
            started.model.name, int(since.timestamp()) // self._bucket_seconds
        )
        chosen = choose_warm_set(offered, budget_tokens=settings.budget_tokens, max_items=settings.max_items)
        payloads = await self._store.payloads([c.node.key for c in chosen])
        names = await self._store.scope_names(sorted({c.node.key[0] for c in chosen}))
        items = [
            WarmItem(c.node.key[1], c.node.tokens, payloads[c.node.key], *names[c.node.key[0]])
            for c in chosen
            if c.node.key in payloads and c.node.key[0] in names
        ]
        items = fit_items(items, self._max_plan_bytes - _ENVELOPE_BYTES)
        plan_id = new_event_id()  # also the event id: a re-publish of the plan is the same event
        return WarmPlanIssued(
            event_id=plan_id,
            occurred_at=now,
            producer="planner",
            model=started.model,
            epoch=started.epoch or 0,
            plan_id=plan_id,
            replica=started.replica,
            node=started.node,
            items=items,
            budget_tokens=settings.budget_tokens,
            deadline=now + timedelta(seconds=settings.deadline_s),
            trigger_event_id=started.event_id,
        )


def fit_items(items: list[WarmItem], max_bytes: int) -> list[WarmItem]:
    """The leading `items` (most valuable first) whose encoded size adds up to at most `max_bytes`, so the
    plan fits in one event; an item that does not fit is left out and smaller later ones still go in."""
    kept: list[WarmItem] = []
    used = 0
    for item in items:
        size = len(msgspec.json.encode(item)) + 1
        if used + size <= max_bytes:
            kept.append(item)
            used += size
    return kept
