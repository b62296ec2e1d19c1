"""The planner's reactions: a handler per trigger type (`core/triggers.py`), run by the planning task
(`planning.py`) after the trigger's batch committed; `bootstrap.planning_handlers` is their table.

- `plan_starts` (`replica.started`): plans the replicas. A crashed replica that comes back is a new start:
  it holds nothing (held items count from its latest start on), so it is warmed again in full.
- `plan_bump` (`epoch.bumped`): plans the new epoch of (tenant, model) on every live replica, starting ones
  included.
- `apply_deploy` (`deploy.started` / `deploy.finished`): for each tenant of the model (or the event's
  tenant, if set) whose epoch was not bumped for these revisions (`core.deploy_epochs`), raises the epoch,
  publishes `epoch.bumped` to the lifecycle topic (gateways move their salts; this planner's own copy plans
  nothing more) and plans the new epoch at once.
- `replan_ready` (`fleet.scaled` down, `replica.draining_started`, `replica.lost`): replicas leave, so the
  ready replicas take their keys: they are planned for what they lack. Scaled up, nothing is planned: on
  the ring a ready replica only loses keys to the newcomers, and it is at its busiest (the scale-up is
  why), so a top-up there would only slow live traffic (`bench.scaleup` showed it). New replicas are
  planned by their own `replica.started`, which their warmer announces before the engine loads and holds
  `/ready` on, so they are warm before they take traffic.
- `hear` (`replica.heartbeat`): to the liveness watch, which puts back a replica marked lost that still
  serves.
- `rewarm` (`replica.rewarm_requested`, the API's re-warm action): plans that replica in full, as if it
  held nothing, flagged `rewarm` so its warmer warms even what it believes it holds.
- `count_outcomes` (`warm.finished`): the plan outcomes that stood (the first for each plan) are counted
  (`warmplane_planner_plan_outcomes_total{outcome}`).
- `judge_cold_starts` (request counts) feeds the cold-start alarm (`core.cold_start`): when it fires for a
  model, the alarm is recorded (`cold_start_alarms`), counted
  (`warmplane_planner_cold_start_alarms_total{model}`) and the model's ready replicas are planned again
  (only what they lack); when it clears, its row is closed.

Every reaction is idempotent on its trigger (plans are unique on (trigger, replica); a bump is a
compare-and-set on the epoch; one open alarm per model). One that raises is logged and counted by the
planning task, and the batch's counts stand.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Protocol

from warmplane.services.planner.core.cold_start import ColdStartMonitor, ColdStartRule, Verdict
from warmplane.services.planner.core.deploy_epochs import EpochState, Revisions, deploy_bumps
from warmplane.services.planner.core.triggers import (
    BumpToPlan,
    CountsToAbsorb,
    DeployToApply,
    HeartbeatsHeard,
    OutcomesReported,
    ReadyToReplan,
    RequestsCounted,
    RewarmToPlan,
    StartsToPlan,
)
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.plans import PlanIssuer, Wanted
from warmplane.services.planner.settings import ColdStartSettings
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import DeployFinished, DeployStarted, EpochBumped, Event, ReplicaHeartbeat

log = logging.getLogger(__name__)
READY = frozenset({"ready"})


class FleetStore(Protocol):
    """What reactions need of the database (`pg_fleet.PgFleetStore` is the real one)."""

    async def epoch_states(self, model: str, tenant: str) -> list[EpochState]: ...
    async def record_bump(self, bump: EpochBumped, deployed: Revisions, expected_epoch: int) -> bool: ...
    async def mark_bump_published(self, event_id: uuid.UUID, at: datetime) -> None: ...
    async def unpublished_bumps(self, before: datetime) -> list[EpochBumped]: ...
    async def open_alarm(
        self,
        model: str,
        *,
        window: tuple[datetime, datetime],
        requests: int,
        cold_requests: int,
        at: datetime,
    ) -> uuid.UUID | None: ...
    async def alarm_planned(self, alarm_id: uuid.UUID, replicas: int) -> None: ...
    async def clear_alarm(self, model: str, at: datetime) -> bool: ...


class Liveness(Protocol):
    """What reactions tell the liveness watch (`liveness.LivenessWatch`): the batch's heartbeats."""

    async def heard(self, beats: Mapping[str, ReplicaHeartbeat]) -> object:
        """Never raises."""


class EventPublisher(Protocol):
    async def publish(self, event: Event) -> None:
        """Return once the broker acknowledged `event` (on its family's topic); raise if it did not."""


class FleetReactor:
    """The planning task's handlers (module doc); `catch_up` publishes bumps the broker never took."""

    def __init__(
        self,
        *,
        issuer: PlanIssuer,
        store: FleetStore,
        publisher: EventPublisher,
        cold_start: ColdStartSettings,
        bucket_seconds: int,
        metrics: PlannerMetrics,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        liveness: Liveness | None = None,
    ) -> None:
        self._liveness = liveness
        self._issuer = issuer
        self._store = store
        self._publisher = publisher
        self._bucket_seconds = bucket_seconds
        self._metrics = metrics
        self._clock = clock
        self._watch_cold_starts = cold_start.enabled
        sustain = max(1, round(cold_start.sustain_s / bucket_seconds))
        self.monitor = ColdStartMonitor(
            ColdStartRule(cold_start.alarm_ratio, cold_start.clear_ratio, sustain, cold_start.min_requests)
        )

    @property
    def request_buckets_s(self) -> int | None:
        """The bucket width request counts are wanted in (`RequestsCounted`); None with the alarm off."""
        return self._bucket_seconds if self._watch_cold_starts else None

    async def plan_starts(self, starts: StartsToPlan) -> None:
        wanted = [Wanted.start(started) for started in starts.starts]
        await self._issuer.issue_all(wanted, committed_at=starts.committed_at)

    async def plan_bump(self, bumped: BumpToPlan) -> None:
        await self._issuer.replan(bumped.bump)

    async def apply_deploy(self, deploy: DeployToApply) -> None:
        await self._deploy(deploy.deploy)

    async def replan_ready(self, leaving: ReadyToReplan) -> None:
        log.info("%s: planning the ready replicas of %s again", leaving.why, leaving.model)
        await self._issuer.plan_live(leaving.model, leaving.trigger.event_id, states=READY)

    async def rewarm(self, asked: RewarmToPlan) -> None:
        request = asked.request
        plans = await self._issuer.rewarm(request.model.name, request.replica, request.event_id)
        log.info(
            "re-warm of %s requested by %s (%s): %s",
            request.replica,
            request.producer,
            request.reason or "no reason given",
            f"plan {plans[0].plan_id}" if plans else "not live, or already planned for it",
        )

    async def hear(self, heard: HeartbeatsHeard) -> None:
        if self._liveness is not None:
            await self._liveness.heard(heard.beats)

    async def count_outcomes(self, reported: OutcomesReported) -> None:
        await self._issuer.count_outcomes(reported.results)

    async def absorb_counts(self, _waiting: CountsToAbsorb) -> None:
        await self._issuer.absorb_committed()

    async def judge_cold_starts(self, counted: RequestsCounted) -> None:
        if not self._watch_cold_starts:
            return
        for (model, bucket), (requests, cold) in counted.counts.items():
            self.monitor.observe(model, bucket, requests, cold)
        for model in sorted({model for model, _ in counted.counts}):
            verdict = self.monitor.judge(model)
            if verdict is None:
                continue
            try:
                await self._alarm(verdict)
            except Exception:
                if verdict.kind == "fired":
                    self.monitor.rearm(model)  # not recorded: the next counts judge it again
                raise

    async def _deploy(self, deploy: DeployStarted | DeployFinished) -> None:
        """Bump the epochs the deploy makes stale, publish the bumps, and plan the new epochs."""
        deployed = Revisions.of(deploy)
        states = await self._store.epoch_states(deploy.model.name, deploy.tenant)
        bumps = []
        for tenant, current, following in deploy_bumps(states, deployed):
            bump = EpochBumped(
                event_id=new_event_id(),
                occurred_at=self._clock(),
                producer="planner",
                tenant=tenant,
                model=deploy.model,
                epoch=following,
                reason=f"deploy of weights {deployed.model_revision!r}, prompts {list(deployed.prompt_revs)}"[
                    :256
                ],
            )
            if await self._store.record_bump(bump, deployed, current):
                self._metrics.epoch_bumps.labels(reason="deploy").inc()
                log.info(
                    "deploy %s bumps %s/%s to epoch %d", deploy.event_id, tenant, deploy.model.name, following
                )
                bumps.append(bump)
        await asyncio.gather(*(self._publish_bump(bump) for bump in bumps))
        for bump in bumps:
            await self._issuer.replan(bump)

    async def _publish_bump(self, bump: EpochBumped) -> None:
        try:
            await self._publisher.publish(bump)
        except Exception:  # recorded: `catch_up` publishes it again
            self._metrics.plan_failures.inc()
            log.exception(
                "epoch bump %s is recorded but not published; it will be published again", bump.event_id
            )
            return
        await self._store.mark_bump_published(bump.event_id, self._clock())

    async def _alarm(self, verdict: Verdict) -> None:
        model, now = verdict.model, self._clock()
        if verdict.kind == "cleared":
            if await self._store.clear_alarm(model, now):
                log.info("cold-start alarm of %s cleared: cold share %.2f", model, verdict.ratio)
            return
        width = self._bucket_seconds
        window = (
            datetime.fromtimestamp(verdict.first_bucket * width, UTC),
            datetime.fromtimestamp((verdict.last_bucket + 1) * width, UTC),
        )
        alarm_id = await self._store.open_alarm(
            model, window=window, requests=verdict.requests, cold_requests=verdict.cold_requests, at=now
        )
        if alarm_id is None:
            return  # already open (another planner instance fired it, or this one before a restart)
        self._metrics.cold_start_alarms.labels(model=model).inc()
        log.warning(
            "cold-start alarm of %s: %.0f%% of %d requests found no cached prefix from %s to %s; re-planning",
            model,
            100 * verdict.ratio,
            verdict.requests,
            window[0].isoformat(),
            window[1].isoformat(),
        )
        plans = await self._issuer.plan_live(model, alarm_id, states=READY)
        await self._store.alarm_planned(alarm_id, len(plans))

    async def catch_up(self, grace_s: float) -> int:
        """Publish the bumps recorded more than `grace_s` ago that the broker never took; how many. Raises
        what the store raises."""
        stale = await self._store.unpublished_bumps(self._clock() - timedelta(seconds=grace_s))
        await asyncio.gather(*(self._publish_bump(bump) for bump in stale))
        return len(stale)
