"""One replica's driver: the loop that checks its engine's health, runs its plans and reports what happens.

All state changes of a replica happen on this loop, through its `ReplicaTracker`; the plan consumer only
offers plans and wakes it. A plan runs as a task (`PlanRun`) the loop watches: when the engine stops
answering, or the plan's deadline passes, the loop cancels the run and reports what it achieved.

What it publishes (through `publish`, which must not lose events): every lifecycle transition, progress of
a running plan at most every `progress_interval_s`, one `warm.finished` per plan run, and, when the engine's
KV events are configured, `replica.residency` whenever what its warmed prefixes hold changes
(`ResidencyWatch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from warmplane.services.warmer.core.replica import Phase, ReplicaTracker, RunOrder, Transition, held_key
from warmplane.services.warmer.metrics import WarmerMetrics
from warmplane.services.warmer.plan_run import PlanRun, RunReport
from warmplane.services.warmer.residency_watch import ResidencyWatch
from warmplane.services.warmer.settings import EngineSettings, WarmSettings
from warmplane.services.warmer.vllm_client import EngineClient
from warmplane.shared.cache_salt import SaltBook
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    HEARTBEATING_STATES,
    Event,
    HeldPrefixes,
    ModelRef,
    ReplicaBecameReady,
    ReplicaCrashed,
    ReplicaDrainingStarted,
    ReplicaEvent,
    ReplicaHeartbeat,
    ReplicaResidency,
    ReplicaStarted,
    ReplicaStopped,
    ReplicaWarmingStarted,
    ReplicaWeightsLoaded,
    WarmFinished,
    WarmPlanIssued,
    WarmProgressed,
)

log = logging.getLogger(__name__)

_LIFECYCLE: dict[Phase, type[ReplicaEvent]] = {
    Phase.STARTING: ReplicaStarted,
    Phase.LOADING: ReplicaWeightsLoaded,
    Phase.WARMING: ReplicaWarmingStarted,
    Phase.READY: ReplicaBecameReady,
    Phase.FAILED: ReplicaCrashed,
    Phase.DRAINING: ReplicaDrainingStarted,
    Phase.STOPPED: ReplicaStopped,
}
_IN_FLIGHT_POLL_S = 0.25


class ReplicaDriver:
    """Drives one engine. `run()` is its loop; `wake()` makes it look again at once (a plan arrived)."""

    def __init__(
        self,
        *,
        node: str,
        engine: EngineSettings,
        client: EngineClient,
        tracker: ReplicaTracker,
        salts: SaltBook,
        warm: WarmSettings,
        publish: Callable[[Event], None],
        metrics: WarmerMetrics,
        clock: Callable[[], datetime],
    ) -> None:
        self.node = node
        self.engine = engine
        self.client = client
        self.tracker = tracker
        self._salts = salts
        self._warm = warm
        self._publish = publish
        self._metrics = metrics
        self._clock = clock
        self._model = ModelRef(engine.served_model, engine.model_revision)
        self._wake = asyncio.Event()
        self._run: PlanRun | None = None
        self._run_task: asyncio.Task[RunReport] | None = None
        self._run_began = 0.0
        self._stop_reason = ""
        self._incarnation_began = time.monotonic()
        self._last_health = float("-inf")
        self._last_progress = 0.0
        self.last_report: RunReport | None = None
        self.plan_latency_s: float | None = None
        """Seconds from announcing the current incarnation to holding its plan."""
        self.kv_capacity_tokens: int | None = None
        """What the engine's prefix cache holds, read from its metrics once it answers; None if unknown."""
        self.residency: ResidencyWatch | None = None
        if engine.kv_events_endpoint is not None:
            self.residency = ResidencyWatch(
                engine=engine, warm=warm, client=client, salts=salts, report=self._residency, wake=self.wake
            )

    @property
    def replica(self) -> str:
        return self.engine.replica

    def wake(self) -> None:
        self._wake.set()

    def accepted(self, plan: WarmPlanIssued) -> None:
        """`plan` was accepted: time it from this incarnation's announcement if it answers that, then
        look at it at once."""
        if plan.trigger_event_id is not None and plan.trigger_event_id == self.tracker.incarnation:
            latency = time.monotonic() - self._incarnation_began
            self.plan_latency_s = latency
            self._metrics.plan_latency.observe(latency)
        self._wake.set()

    def heartbeat(self) -> ReplicaHeartbeat | None:
        """This replica's heartbeat now, or None in a phase that sends none (crashed, stopped)."""
        state = _LIFECYCLE[self.tracker.phase].STATE
        if state not in HEARTBEATING_STATES:
            return None
        return ReplicaHeartbeat(event_id=new_event_id(), **self._envelope(), state=state)

    def progress(self) -> RunReport | None:
        """The running plan's report so far, else the last finished one's."""
        return self._run.report() if self._run is not None else self.last_report

    async def run(self) -> None:
        """Announce the replica, then watch it until cancelled; a running plan is cancelled with it."""
        self._report(self.tracker.start())
        feed = None
        if self.residency is not None:
            feed = asyncio.create_task(self.residency.run(), name=f"kv events {self.replica}")
        try:
            while True:
                try:
                    await self._step()
                except Exception:  # one bad step must not leave the replica unwatched
                    log.exception("replica %s: a step failed; trying again", self.replica)
                # Not `asyncio.wait_for`: on Python 3.11 it swallows a cancellation that arrives as the
                # wake-up completes (gh-86296), and the driver then watched on after its warmer stopped,
                # which hung the warmer's stop for good. `asyncio.timeout` re-raises it.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._next_wait()):
                        await self._wake.wait()
                self._wake.clear()
        finally:
            for task in (self._run_task, feed):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task

    async def drain(self, reason: str, *, settle_s: float, timeout_s: float) -> None:
        """Take the replica out of service for good: announce it draining, give routers `settle_s` to stop
        sending it requests, then wait (at most `timeout_s` more) until its engine has none in flight, and
        announce it stopped. Call it once `run()` has been cancelled."""
        self._report(self.tracker.drain(reason))
        await asyncio.sleep(settle_s)
        deadline = time.monotonic() + timeout_s
        while True:
            left = await self.client.requests_in_flight()
            if left == 0:
                why = "drained: no request in flight"
                break
            if left is None and not await self.client.health():
                why = "drained: the engine no longer answers"
                break
            if time.monotonic() >= deadline:
                count = "an unknown number of" if left is None else str(left)
                why = f"drain timed out after {settle_s + timeout_s:g} s with {count} requests in flight"
                break
            await asyncio.sleep(_IN_FLIGHT_POLL_S)
        self._report(self.tracker.stop(why))

    def _next_wait(self) -> float:
        wait = self._warm.health_interval_s
        if self._run_task is not None:
            wait = min(wait, self._warm.progress_interval_s)
        return wait

    async def _step(self) -> None:
        tracker = self.tracker
        if time.monotonic() - self._last_health >= self._warm.health_interval_s:
            self._last_health = time.monotonic()
            ok = await self.client.health()
            if ok and tracker.phase in (Phase.STARTING, Phase.FAILED):  # loaded: how much can it hold?
                self.kv_capacity_tokens = await self.client.kv_capacity_tokens()
            self._report(tracker.health(ok, self._clock()))
        if self._run_task is not None and not self._run_task.done():
            if tracker.phase is Phase.FAILED:
                self._cancel_run("the engine stopped answering")
            elif tracker.overdue(self._clock()) is not None:
                self._cancel_run("the plan's deadline passed")
            else:
                self._maybe_progress()
        if self._run_task is not None and self._run_task.done():
            self._finish_run()
        self._report(tracker.tick(self._clock()))
        capacity = self.kv_capacity_tokens
        fill_limit = None if capacity is None else int(capacity * self._warm.max_kv_fill)
        if (order := tracker.next_run(fill_limit)) is not None:
            self._start_run(order)
        if self.residency is not None and tracker.incarnation is not None:
            answers = tracker.phase in (Phase.LOADING, Phase.WARMING, Phase.READY)
            idle = answers and self._run_task is None
            self.residency.step(tracker.held, idle=idle, forget=tracker.forget)

    def _start_run(self, order: RunOrder) -> None:
        self._report(order.transitions)
        plan = order.plan
        log.info(
            "replica %s: running plan %s, %d items (%d already held, %d left out), %d in flight",
            self.replica,
            plan.plan_id,
            len(order.items),
            order.already_held,
            order.left_out,
            order.concurrency,
        )
        self._run = PlanRun(
            order,
            self.client,
            self._salts,
            priority=self._warm.priority,
            attempts=self._warm.attempts,
            probe_concurrency=order.concurrency if self.tracker.ready else self._warm.probe_concurrency,
            verify_each=fits_easily(order, self.kv_capacity_tokens),
        )
        self._run_began = time.monotonic()
        self._last_progress = self._run_began
        self._stop_reason = ""
        self._run_task = asyncio.create_task(self._run.run(), name=f"warm {self.replica} {plan.plan_id}")
        self._run_task.add_done_callback(lambda _: self._wake.set())

    def _cancel_run(self, reason: str) -> None:
        assert self._run_task is not None
        self._stop_reason = reason
        self._run_task.cancel()

    def _finish_run(self) -> None:
        task, run = self._run_task, self._run
        assert task is not None and run is not None
        self._run_task = self._run = None
        if task.cancelled():
            report, stopped = run.report(), self._stop_reason or "cancelled"
        elif (error := task.exception()) is not None:
            log.error("replica %s: plan run failed", self.replica, exc_info=error)
            report, stopped = run.report(), f"the run failed: {error!r}"
        else:
            report, stopped = task.result(), ""
        self.last_report = report
        plan = run.order.plan
        seconds = time.monotonic() - self._run_began
        self._metrics.plan_seconds.observe(seconds)
        self._metrics.tokens_prefilled.labels(self.replica).inc(report.tokens_prefilled)
        self._metrics.items.labels(self.replica, "verified").inc(len(report.verified))
        self._metrics.items.labels(self.replica, "held").inc(report.already_held)
        self._metrics.items.labels(self.replica, "failed").inc(len(report.failures))
        failures = report.failures + ([f"stopped: {stopped}"] if stopped else [])
        if run.order.left_out:
            failures.append(
                f"left out: {run.order.left_out} items beyond {self._warm.max_kv_fill:.0%} of the KV cache "
                f"({self.kv_capacity_tokens} tokens)"
            )
        self._publish(
            WarmFinished(
                event_id=new_event_id(),
                occurred_at=self._clock(),
                producer=self._producer,
                model=plan.model,
                epoch=plan.epoch,
                plan_id=plan.plan_id,
                replica=self.replica,
                items_done=report.items_done,
                tokens_prefilled=report.tokens_prefilled,
                verified_hits=len(report.verified) + report.already_held,
                failures=[failure[:2048] for failure in failures[:100]],
                partial=bool(failures),
            )
        )
        log.info(
            "replica %s: plan %s finished in %.1f s: %d verified, %d held before, %d tokens pre-filled, "
            "%d failures%s",
            self.replica,
            plan.plan_id,
            seconds,
            len(report.verified),
            report.already_held,
            report.tokens_prefilled,
            len(report.failures),
            f" ({stopped})" if stopped else "",
        )
        self._report(self.tracker.finished(report.outcome(stopped), self._clock()))
        if self.residency is not None and self.tracker.phase is not Phase.FAILED:
            self.residency.learn(report, {held_key(plan, item): item.payload for item in run.order.items})

    def _maybe_progress(self) -> None:
        run = self._run
        if run is None or time.monotonic() - self._last_progress < self._warm.progress_interval_s:
            return
        self._last_progress = time.monotonic()
        report = run.report()
        plan = run.order.plan
        self._publish(
            WarmProgressed(
                event_id=new_event_id(),
                occurred_at=self._clock(),
                producer=self._producer,
                model=plan.model,
                epoch=plan.epoch,
                plan_id=plan.plan_id,
                replica=self.replica,
                items_done=report.items_done,
                items_total=report.items_total,
                tokens_prefilled=report.tokens_prefilled,
            )
        )

    def _residency(self, held: list[HeldPrefixes], lost: int, complete: bool) -> None:
        incarnation = self.tracker.incarnation
        assert incarnation is not None
        self._metrics.resident.labels(self.replica).set(sum(len(group.prefix_ids) for group in held))
        self._metrics.lost.labels(self.replica).set(lost)
        self._metrics.residency_complete.labels(self.replica).set(1 if complete else 0)
        self._publish(
            ReplicaResidency(
                event_id=new_event_id(),
                **self._envelope(),
                incarnation=incarnation,
                held=held,
                lost=lost,
                complete=complete,
            )
        )

    def refuse(self, plan: WarmPlanIssued, reason: str) -> None:
        """Report a plan this replica will not run (any reason but a duplicate): a finished, empty warm."""
        self._publish(refusal(plan, reason, producer=self._producer, at=self._clock()))

    @property
    def _producer(self) -> str:
        return f"warmer/{self.node}"

    def _envelope(self) -> dict[str, Any]:
        """The fields every event about this replica carries, as of now."""
        return {
            "occurred_at": self._clock(),
            "producer": self._producer,
            "model": self._model,
            "replica": self.replica,
            "node": self.node,
        }

    def _report(self, transitions: list[Transition]) -> None:
        for transition in transitions:
            self._metrics.ready.labels(self.replica).set(1 if self.tracker.ready else 0)
            self._metrics.partial.labels(self.replica).set(1 if self.tracker.partial else 0)
            if transition.phase is Phase.STARTING:
                self._incarnation_began = time.monotonic()
                self.plan_latency_s = None
                if self.residency is not None:
                    self.residency.restart()
            elif transition.phase is Phase.READY:
                self._metrics.time_to_ready.observe(time.monotonic() - self._incarnation_began)
            elif transition.phase is Phase.FAILED:
                self._metrics.crashes.labels(self.replica).inc()
            log.info("replica %s: %s (%s)", self.replica, transition.phase, transition.reason)
            self._publish(
                _LIFECYCLE[transition.phase](
                    event_id=transition.event_id,
                    **self._envelope(),
                    endpoint=self.engine.announced_url,
                    kv_capacity_tokens=self.kv_capacity_tokens,
                    reason=transition.reason[:2048],
                )
            )


def fits_easily(order: RunOrder, kv_capacity_tokens: int | None) -> bool:
    """Whether `order` fills at most half of a KV cache of `kv_capacity_tokens` (unknown: no), so that no
    item of it can evict another and each may be verified as soon as it is warm."""
    if kv_capacity_tokens is None:
        return False
    return 2 * sum(item.tokens for item in order.items) <= kv_capacity_tokens


def refusal(plan: WarmPlanIssued, reason: str, *, producer: str, at: datetime) -> WarmFinished:
    """The result event of a plan that will not run, saying why."""
    return WarmFinished(
        event_id=new_event_id(),
        occurred_at=at,
        producer=producer,
        model=plan.model,
        epoch=plan.epoch,
        plan_id=plan.plan_id,
        replica=plan.replica,
        items_done=0,
        tokens_prefilled=0,
        verified_hits=0,
        failures=[f"refused: {reason}"[:2048]],
        partial=True,
    )
