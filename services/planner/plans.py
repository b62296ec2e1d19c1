"""Issuing warm plans: recorded in Postgres, then published to the plans topic keyed by node.

`issue` plans a replica that started (the plan names the `replica.started` it answers, its
`trigger_event_id`, so a warmer drops a plan for an earlier start); `replan` plans the new epoch of a
(tenant, model) on every live replica of the model (a bump invalidates caches, not knowledge);
`plan_live` plans the live replicas of a model again for another reason (a fleet change, a cold-start
alarm). Items are chosen by `plan_choice.WarmSetChooser` (the policy core). A plan for a running replica
that would warm nothing (it holds everything it should, or warming would buy too little) is not issued; a
starting replica always gets its plan, empty or not, since its warmer waits for one; an empty one says
why in `empty_reason` when the policy judged warming not worth it, and the replica turns ready at once.
Each plan is recorded (unique on (trigger, replica), so a redelivered trigger issues nothing), and only
when the row was inserted published.

Delivery is at least once: a plan is recorded (with the event it is published as) before it is
published, and marked once the broker acknowledged it. `catch_up`, run periodically, publishes again
what was never acknowledged (the plan's event id is its plan id, so a warmer sees a second copy as a
duplicate) and plans the replicas whose start committed but was never planned (a planner stopped between
a batch's commit and its plans).
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.plan_choice import Choice, ChoiceStore, WarmSetChooser
from warmplane.services.planner.settings import PlanRingSettings, PlanSettings
from warmplane.shared.codec import DEFAULT_MAX_EVENT_BYTES
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    LIVE_REPLICA_STATES,
    EpochBumped,
    ModelRef,
    ReplicaStarted,
    WarmFinished,
    WarmPlanIssued,
)
from warmplane.shared.plan_states import plan_state

log = logging.getLogger(__name__)


class PlanStore(ChoiceStore, Protocol):
    """What issuing needs of the database (`pg_plans.PgPlanStore` is the real one)."""

    async def record(self, plans: Sequence[tuple[WarmPlanIssued, uuid.UUID]]) -> set[uuid.UUID]: ...
    async def mark_published(self, plan_ids: Sequence[uuid.UUID], at: datetime) -> None: ...
    async def unpublished(self, *, issued_before: datetime, alive_at: datetime) -> list[WarmPlanIssued]: ...
    async def unplanned_starts(self, *, since: datetime, before: datetime) -> list[Unplanned]: ...
    async def standing(self, results: Sequence[WarmFinished]) -> list[WarmFinished]: ...


class PlanPublisher(Protocol):
    """Where plans go (`shared.event_publisher.KafkaEventPublisher` is the real one: to the plans topic,
    keyed by node)."""

    async def publish(self, event: WarmPlanIssued) -> None:
        """Return once the broker acknowledged `event`; raise if it did not in time."""


class PlanIssuer:
    """Plans replicas: `issue` one start, `replan` one bump, `plan_live` a model's running replicas."""

    def __init__(
        self,
        *,
        store: PlanStore,
        publisher: PlanPublisher,
        settings: PlanSettings,
        bucket_seconds: int,
        metrics: PlannerMetrics,
        ring: PlanRingSettings | None = None,
        max_plan_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._chooser = WarmSetChooser(
            store,
            settings,
            ring or PlanRingSettings(),
            bucket_seconds=bucket_seconds,
            max_plan_bytes=max_plan_bytes,
            clock=clock,
            metrics=metrics,
        )

    def counts_committed(self, batch: IngestBatch, positions: Mapping[tuple[str, int], int]) -> bool:
        """`batch` committed with its partitions at `positions`: True if kept reads will absorb its counts
        (`WarmSetChooser.counts_committed`)."""
        return self._chooser.counts_committed(batch, positions)

    async def absorb_committed(self) -> None:
        """Kept reads absorb the counts committed since they last did, and those due are read again in the
        background (`WarmSetChooser.absorb_committed`)."""
        await self._chooser.absorb_committed()

    async def refreshed(self) -> None:
        """Return once the reads being made again ahead of plans are kept (`WarmSetChooser.refreshed`)."""
        await self._chooser.refreshed()

    async def close(self) -> None:
        """Stop the reads being made again ahead of plans (`WarmSetChooser.close`)."""
        await self._chooser.close()

    def counting_alone(self, alone: bool) -> None:
        """Whether this planner's consumer owns every partition of the traffic topics
        (`WarmSetChooser.counting_alone`)."""
        self._chooser.counting_alone(alone)

    async def count_outcomes(self, results: Sequence[WarmFinished]) -> None:
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

    async def issue(
        self, started: ReplicaStarted, *, committed_at: float = -math.inf
    ) -> WarmPlanIssued | None:
        """Choose, record and publish the plan `started` triggers; None if one was already recorded
        (or it could not be: logged and counted). A plan recorded but not published is returned.
        `committed_at`: as for `issue_all` (by default, before any read this issuer keeps)."""
        plans = await self.issue_all([Wanted.start(started)], committed_at=committed_at)
        return plans[0] if plans else None

    async def replan(self, bump: EpochBumped) -> list[WarmPlanIssued]:
        """Plan the new epoch of (`bump.tenant`, model) on every live replica of the model, starting ones
        included (their start's plan may be of the old epoch); the plans recorded (a replica already
        planned for this bump gets none). Raises what the store raises listing replicas."""
        return await self.plan_live(bump.model.name, bump.event_id, tenant=bump.tenant, epoch=bump.epoch)

    async def plan_live(
        self,
        model: str,
        trigger: uuid.UUID,
        *,
        tenant: str | None = None,
        epoch: int = 0,
        states: Collection[str] = LIVE_REPLICA_STATES,
    ) -> list[WarmPlanIssued]:
        """Plan every replica of `model` in one of `states` for `trigger` (of `tenant`'s prefixes only, at
        least at `epoch` for it, if given); the plans recorded. Raises what the store raises listing
        replicas."""
        live = await self._store.live_replicas(model)
        return await self.issue_all(
            [
                Wanted(Target(r.replica, r.node, ModelRef(model, r.revision), trigger, False), tenant, epoch)
                for r in live
                if r.state in states
            ]
        )

    async def rewarm(self, model: str, replica: str, trigger: uuid.UUID) -> list[WarmPlanIssued]:
        """Plan `replica` of `model` in full (as if it held nothing), flagged so its warmer warms every
        item; nothing if it is not live. Raises what the store raises listing replicas."""
        live = [r for r in await self._store.live_replicas(model) if r.replica == replica]
        return await self.issue_all(
            [
                Wanted(
                    Target(r.replica, r.node, ModelRef(model, r.revision), trigger, False, rewarm=True),
                    None,
                    0,
                )
                for r in live
                if r.state in LIVE_REPLICA_STATES
            ]
        )

    async def issue_all(
        self, wanted: Sequence[Wanted], *, committed_at: float | None = None
    ) -> list[WarmPlanIssued]:
        """Choose once per (model, tenant, epoch) for all its replicas, record each plan, then publish them
        all at once: many replicas starting together wait for one read and one round of acknowledgements.
        `committed_at` (monotonic seconds): when the batches of the starts `wanted` answers had committed;
        a group of starts only may then share a read of the counts begun after it; without it, or for a
        re-plan, the counts are read now. Never raises: a failure is logged and counted, and later work
        (catch-up, the next trigger) plans."""
        groups: dict[tuple[str, str | None, int], list[Wanted]] = {}
        for want in wanted:
            groups.setdefault((want.target.model.name, want.tenant, want.epoch), []).append(want)
        recorded: list[WarmPlanIssued] = []
        for (model, tenant, epoch), group in groups.items():
            try:
                choices = await self._chooser.choose(
                    model,
                    tenant,
                    epoch,
                    [w.target.replica for w in group],
                    holding_nothing={w.target.replica for w in group if w.target.rewarm},
                    # Starts one after another share a recent read; a re-plan reads what changed.
                    read_after=committed_at if all(w.target.answers_start for w in group) else None,
                )
            except Exception:  # one group failing must not stop the others; later work re-plans (module doc)
                self._metrics.plan_failures.inc(len(group))
                log.exception("could not choose plans of %s for %d replicas", model, len(group))
                continue
            plans: list[tuple[WarmPlanIssued, uuid.UUID]] = []
            for want in group:
                target, choice = want.target, choices[want.target.replica]
                if choice.empty_reason is not None:
                    self._metrics.empty_plans.labels(choice.empty_reason.value).inc()
                    log.info("replica %s: %s", target.replica, choice.empty_message)
                if not choice.items and not target.answers_start:
                    log.info("replica %s holds its warm set: no plan for %s", target.replica, target.trigger)
                    continue
                try:
                    plans.append((self._plan(target, tenant, epoch, choice), target.trigger))
                except Exception:  # as above
                    self._metrics.plan_failures.inc()
                    log.exception("could not plan replica %s (trigger %s)", target.replica, target.trigger)
            try:
                stored = await self._store.record(plans)
            except Exception:  # as above
                self._metrics.plan_failures.inc(len(plans))
                log.exception("could not record the plans of %s for %d replicas", model, len(plans))
                continue
            recorded += [plan for plan, _ in plans if plan.plan_id in stored]
        await self._publish(recorded)
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
        await self._publish(stale)
        since = now - timedelta(seconds=settings.catch_up_window_s)
        starts = await self._store.unplanned_starts(since=since, before=grace)
        for start in starts:
            log.warning("planning replica %s: its start %s was never planned", start.replica, start.trigger)
        wanted = [
            Wanted(Target(s.replica, s.node, s.model, s.trigger, answers_start=True), None, 0) for s in starts
        ]
        await self.issue_all(wanted)
        return len(stale), len(starts)

    async def _publish(self, plans: Sequence[WarmPlanIssued]) -> None:
        """Publish recorded plans, all at once, and note in one write which the broker took; one it did
        not is logged and counted (its row stays unpublished, and `catch_up` publishes it again)."""
        outcomes = await asyncio.gather(
            *(self._publisher.publish(plan) for plan in plans), return_exceptions=True
        )
        taken: list[WarmPlanIssued] = []
        for plan, outcome in zip(plans, outcomes, strict=True):
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # cancelled: not a publishing failure
            if isinstance(outcome, Exception):
                self._metrics.plan_failures.inc()
                log.error(
                    "plan %s is recorded but not published; it will be published again",
                    plan.plan_id,
                    exc_info=outcome,
                )
            else:
                taken.append(plan)
        try:
            await self._store.mark_published([plan.plan_id for plan in taken], self._clock())
        except Exception:  # they were published: at worst a later catch-up publishes them once more
            log.warning("%d plans were published but could not be marked so", len(taken), exc_info=True)
        for plan in taken:
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

    def _plan(self, target: Target, tenant: str | None, epoch: int, choice: Choice) -> WarmPlanIssued:
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
            items=choice.items,
            budget_tokens=choice.budget_tokens,
            deadline=now + timedelta(seconds=self._settings.deadline_s),
            trigger_event_id=target.trigger if target.answers_start else None,
            rewarm=target.rewarm,
            empty_reason=choice.empty_message,
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
    rewarm: bool = False
    """A requested re-warm: the replica is taken to hold nothing, and its warmer warms every item."""


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

    @staticmethod
    def start(started: ReplicaStarted) -> Wanted:
        """The plan answering `started`, at the epoch the warmer announced (0 if none)."""
        target = Target(started.replica, started.node, started.model, started.event_id, answers_start=True)
        return Wanted(target, None, started.epoch or 0)
