"""Issuing warm plans: after a batch commits, plan each replica it reports starting, and every live
replica of a model whose epoch it bumps.

A starting replica gets the model's most valuable catalogued prefixes under the budget
(`core.simple_plan`), each item at its tenant's current epoch (table `epochs`), and the plan names the
`replica.started` it answers (`trigger_event_id`), so a warmer drops a plan for an earlier start. An
`epoch.bumped` for (tenant, model) gives every replica of the model that is starting, loading, warming
or ready a plan of that tenant's prefixes at the new epoch: a bump invalidates caches, not knowledge.
Each plan is recorded in Postgres (unique on (trigger, replica), so a redelivered trigger issues
nothing), and only when the row was inserted published as `WarmPlanIssued` to the plans topic, keyed by
node.

Delivery is at least once: a plan is recorded (with the event it is published as) before it is
published, and marked once the broker acknowledged it. `catch_up`, run periodically, publishes again
what was never acknowledged (the plan's event id is its plan id, so a warmer sees a second copy as a
duplicate) and plans the replicas whose start committed but was never planned (a planner stopped between
a batch's commit and its plans).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

import msgspec

from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.core.simple_plan import Candidate, NodeKey, choose_warm_set
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.pg_store import plan_state
from warmplane.services.planner.settings import PlanSettings
from warmplane.shared.codec import DEFAULT_MAX_EVENT_BYTES
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    EpochBumped,
    ModelRef,
    PrefixPayload,
    ReplicaStarted,
    WarmFinished,
    WarmItem,
    WarmPlanIssued,
)

log = logging.getLogger(__name__)
_ENVELOPE_BYTES = 4_096
"""Room a plan's fields other than its items take, with margin (names are at most 128 characters)."""


class PlanStore(Protocol):
    """What issuing needs of the database (`pg_plans.PgPlanStore` is the real one)."""

    async def candidates(self, model: str, since_bucket: int) -> list[Candidate]: ...
    async def payloads(self, keys: Sequence[NodeKey]) -> dict[NodeKey, PrefixPayload]: ...
    async def scope_names(self, scope_ids: Sequence[int]) -> dict[int, tuple[str, str]]: ...
    async def current_epochs(self, model: str) -> dict[str, int]: ...
    async def live_replicas(self, model: str) -> list[tuple[str, str]]: ...
    async def record(self, plan: WarmPlanIssued, trigger_event_id: uuid.UUID) -> bool: ...
    async def mark_published(self, plan_id: uuid.UUID, at: datetime) -> None: ...
    async def unpublished(self, *, issued_before: datetime, alive_at: datetime) -> list[WarmPlanIssued]: ...
    async def unplanned_starts(self, *, since: datetime, before: datetime) -> list[Unplanned]: ...
    async def standing(self, results: Sequence[WarmFinished]) -> list[WarmFinished]: ...


class PlanPublisher(Protocol):
    """Where plans go (`shared.event_publisher.KafkaEventPublisher` is the real one: to the plans topic,
    keyed by node)."""

    async def publish(self, event: WarmPlanIssued) -> None:
        """Return once the broker acknowledged `event`; raise if it did not in time."""


class PlanIssuer:
    """Plans starting replicas and epoch bumps. `after_commit` is the ingestor's hook; `issue` plans one
    starting replica, `replan` one bump."""

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
        """Plan every replica that `batch` (already committed) reports starting, and every live replica of
        a model whose epoch it bumps. Never raises: the batch's counts stand whatever happens to its
        plans, and a failure is logged and counted. Counts the plan outcomes `batch` recorded."""
        await self._count_outcomes([r for r in batch.plan_results if isinstance(r, WarmFinished)])
        wanted: list[Wanted] = [
            Wanted(Target(e.replica, e.node, e.model, e.event_id, answers_start=True), None, e.epoch or 0)
            for e in batch.replica_events
            if isinstance(e, ReplicaStarted)
        ]
        for change in batch.fleet_changes:
            if isinstance(change, EpochBumped):
                try:
                    wanted += await self._bump_targets(change)
                except Exception:  # a plan must not stop ingestion; later work re-plans (module doc)
                    self._metrics.plan_failures.inc()
                    log.exception("could not list the replicas of %s to re-plan", change.model.name)
        await self._issue_all(wanted)

    async def _count_outcomes(self, results: Sequence[WarmFinished]) -> None:
        """Count each result that became its plan's outcome (a later one for the same plan, such as a
        restarted warmer refusing an old plan as expired, is not: the table keeps the first)."""
        if not results:
            return
        try:
            standing = await self._store.standing(results)
        except Exception:  # a metric must not stop planning
            log.warning("could not read which of %d plan outcomes stood", len(results), exc_info=True)
            return
        for result in standing:
            self._metrics.plan_outcomes.labels(plan_state(result)).inc()

    async def issue(self, started: ReplicaStarted) -> WarmPlanIssued | None:
        """Choose, record and publish the plan `started` triggers; None if one was already recorded
        (or it could not be: logged and counted). A plan recorded but not published is returned."""
        target = Target(started.replica, started.node, started.model, started.event_id, answers_start=True)
        plans = await self._issue_all([Wanted(target, None, started.epoch or 0)])
        return plans[0] if plans else None

    async def replan(self, bump: EpochBumped) -> list[WarmPlanIssued]:
        """Plan the new epoch of (`bump.tenant`, model) on every live replica of the model; the plans
        recorded (a replica already planned for this bump gets none)."""
        return await self._issue_all(await self._bump_targets(bump))

    async def _bump_targets(self, bump: EpochBumped) -> list[Wanted]:
        return [
            Wanted(
                Target(replica, node, bump.model, bump.event_id, answers_start=False), bump.tenant, bump.epoch
            )
            for replica, node in await self._store.live_replicas(bump.model.name)
        ]

    async def _issue_all(self, wanted: Sequence[Wanted]) -> list[WarmPlanIssued]:
        """Choose once per (model, tenant, epoch), record each plan, then publish them all at once: many
        replicas starting together wait for one choice and one round of acknowledgements."""
        choices: dict[tuple[str, str | None, int], list[WarmItem]] = {}
        recorded: list[WarmPlanIssued] = []
        for want in wanted:
            target = want.target
            try:
                key = (target.model.name, want.tenant, want.epoch)
                if key not in choices:
                    choices[key] = await self._choose(*key)
                plan = self._plan(target, want.tenant, want.epoch, choices[key])
                if await self._store.record(plan, target.trigger):
                    recorded.append(plan)
            except Exception:  # a plan must not stop ingestion; later work re-plans (module doc)
                self._metrics.plan_failures.inc()
                log.exception("could not plan replica %s (trigger %s)", target.replica, target.trigger)
        await asyncio.gather(*(self._publish(plan) for plan in recorded))
        return recorded

    async def catch_up(self) -> tuple[int, int]:
        """Publish again the plans the broker never took, and plan the starts whose batch committed but
        whose plan was never recorded (a planner stopped in between); (plans re-published, starts
        planned). Only what is older than `catch_up_grace_s` is looked at, so the work of a batch still
        being planned is left to it. Raises what the store raises."""
        settings = self._settings
        now = self._clock()
        grace = now - timedelta(seconds=settings.catch_up_grace_s)
        stale = await self._store.unpublished(issued_before=grace, alive_at=now)
        for plan in stale:
            log.warning("publishing plan %s again: the broker never acknowledged it", plan.plan_id)
        await asyncio.gather(*(self._publish(plan) for plan in stale))
        since = now - timedelta(seconds=settings.catch_up_window_s)
        starts = await self._store.unplanned_starts(since=since, before=grace)
        for start in starts:
            log.warning("planning replica %s: its start %s was never planned", start.replica, start.trigger)
        wanted = [
            Wanted(Target(s.replica, s.node, s.model, s.trigger, answers_start=True), None, 0) for s in starts
        ]
        await self._issue_all(wanted)
        return len(stale), len(starts)

    async def _publish(self, plan: WarmPlanIssued) -> None:
        """Publish a recorded plan and note that the broker took it; if it did not, log and count it (its
        row stays unpublished, and `catch_up` publishes it again)."""
        try:
            await self._publisher.publish(plan)
        except Exception:
            self._metrics.plan_failures.inc()
            log.exception("plan %s is recorded but not published; it will be published again", plan.plan_id)
            return
        try:
            await self._store.mark_published(plan.plan_id, self._clock())
        except Exception:  # it was published: at worst a later catch-up publishes it once more
            log.warning("plan %s was published but could not be marked so", plan.plan_id, exc_info=True)
        self._metrics.plans_issued.inc()
        log.info(
            "issued plan %s for replica %s on %s (epoch %d%s): %d items, %d tokens",
            plan.plan_id,
            plan.replica,
            plan.node,
            plan.epoch,
            f", tenant {plan.tenant}" if plan.tenant else "",
            len(plan.items),
            sum(item.tokens for item in plan.items),
        )

    async def _choose(self, model: str, tenant: str | None, epoch: int) -> list[WarmItem]:
        """The items of a plan for `model`: of `tenant`'s prefixes only if given, each at its tenant's
        current epoch (at least `epoch` for `tenant`), cut to fit one event."""
        settings = self._settings
        since = self._clock() - timedelta(hours=settings.window_hours)
        offered = await self._store.candidates(model, int(since.timestamp()) // self._bucket_seconds)
        names = await self._store.scope_names(sorted({c.node.key[0] for c in offered}))
        if tenant is not None:
            offered = [c for c in offered if names.get(c.node.key[0], ("",))[0] == tenant]
        chosen = choose_warm_set(offered, budget_tokens=settings.budget_tokens, max_items=settings.max_items)
        payloads = await self._store.payloads([c.node.key for c in chosen])
        epochs = await self._store.current_epochs(model)
        if tenant is not None:
            epochs[tenant] = max(epochs.get(tenant, 0), epoch)
        items = []
        for c in chosen:
            scope, prefix = c.node.key
            if c.node.key in payloads and scope in names:
                item_tenant, prompt_rev = names[scope]
                payload = payloads[c.node.key]
                items.append(
                    WarmItem(
                        prefix, c.node.tokens, payload, item_tenant, prompt_rev, epochs.get(item_tenant, 0)
                    )
                )
        return fit_items(items, self._max_plan_bytes - _ENVELOPE_BYTES)

    def _plan(self, target: Target, tenant: str | None, epoch: int, items: list[WarmItem]) -> WarmPlanIssued:
        now = self._clock()
        plan_id = new_event_id()  # also the event id: a re-publish of the plan is the same event
        return WarmPlanIssued(
            event_id=plan_id,
            occurred_at=now,
            producer="planner",
            tenant=tenant or "",
            model=target.model,
            epoch=epoch,
            plan_id=plan_id,
            replica=target.replica,
            node=target.node,
            items=items,
            budget_tokens=self._settings.budget_tokens,
            deadline=now + timedelta(seconds=self._settings.deadline_s),
            trigger_event_id=target.trigger if target.answers_start else None,
        )


@dataclass(frozen=True, slots=True)
class Target:
    """The replica a plan is for, and what triggered it (`answers_start`: a `replica.started`, which the
    plan then names, so that a warmer drops it after a later start)."""

    replica: str
    node: str
    model: ModelRef
    trigger: uuid.UUID
    answers_start: bool


@dataclass(frozen=True, slots=True)
class Unplanned:
    """A replica still starting or loading whose latest `replica.started` (`trigger`) has no plan."""

    replica: str
    node: str
    model: ModelRef
    trigger: uuid.UUID


@dataclass(frozen=True, slots=True)
class Wanted:
    """A plan to issue: for `target`, of `tenant`'s prefixes only (None: every tenant), at `epoch`."""

    target: Target
    tenant: str | None
    epoch: int


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
