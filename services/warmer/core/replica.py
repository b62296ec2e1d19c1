"""One replica as its warmer sees it: lifecycle, plans, what it holds, and whether it is ready. Pure: no I/O.

The service feeds it facts (a health check's answer, a plan off the topic, a run's outcome, the clock) and
publishes the `Transition`s it returns as lifecycle events; it never decides readiness itself.

    starting --/health answers--> loading --plan runs--> warming --verified--> ready
        ^                            |                      |
        |                            +--no plan in time-----+--deadline (policy)--> ready (partial)
        +--/health answers again-- failed <--N failed checks-- (loading | warming | ready)

    any phase --drain--> draining --in-flight requests done--> stopped (final)

Contracts:
- Ready only after the current incarnation's plan verified (at least `min_verified_fraction` of the
  items it had to warm), or after its deadline or the plan wait passed under the `ready_partial` policy;
  then `partial` is true and the reason says what was missing. A failed replica is never ready.
- An incarnation is one life of the engine: it begins with a `starting` transition whose event id is the
  incarnation id; a crash ends it and forgets everything the replica held.
- A plan is applied at most once (by plan id), never past its deadline, never for an earlier incarnation
  (by its trigger event id); its items of an epoch older than one already accepted for their (tenant,
  model) are left out, and a plan with nothing else is refused.
- Items already held (verified in this incarnation, same tenant, model, prompt revision, epoch and
  prefix) are not warmed again.
- A draining replica is never ready again, takes no plan and runs none; health checks no longer move it
  (an engine shutting down may stop answering without having crashed). `stopped` is its last word.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Literal

import msgspec

from warmplane.shared.events import WarmItem, WarmPlanIssued

HeldKey = tuple[str, str, str, int, int]
"""(tenant, model, prompt revision, epoch, prefix id): one warmed prefix in one cache namespace."""
_REMEMBERED_PLANS = 4_096


class Phase(StrEnum):
    STARTING = "starting"
    LOADING = "loading"
    WARMING = "warming"
    READY = "ready"
    FAILED = "failed"
    DRAINING = "draining"
    STOPPED = "stopped"


_REFUSED_IN = {
    Phase.FAILED: "the engine is not answering; its next start gets a new plan",
    Phase.DRAINING: "the replica is draining: it is leaving the fleet",
    Phase.STOPPED: "the replica is stopped: it has left the fleet",
}
"""Why a plan is refused in these phases, whatever it holds."""


@dataclass(frozen=True, slots=True)
class Transition:
    """A lifecycle change to publish: `event_id` is the event's id (for `starting`, the incarnation)."""

    phase: Phase
    reason: str
    event_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Decision:
    accepted: bool
    reason: str


@dataclass(frozen=True, slots=True)
class RunOrder:
    """A plan to carry out now: `items` (held ones removed, and the tail that would overfill the KV
    cache: `left_out`) at `concurrency` requests in flight."""

    plan: WarmPlanIssued
    items: list[WarmItem]
    already_held: int
    concurrency: int
    transitions: list[Transition]
    left_out: int = 0


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a run achieved: the keys a probe verified, items it had to warm (`needed`, excluding ones too
    short to cache), and why it stopped early if it did."""

    plan_id: uuid.UUID
    verified: frozenset[HeldKey]
    needed: int
    already_held: int
    stopped: str = ""

    @property
    def fraction(self) -> float:
        """The share of the plan's cacheable items that are now verified held (1.0 for an empty plan)."""
        total = self.needed + self.already_held
        return 1.0 if total == 0 else (len(self.verified) + self.already_held) / total


@dataclass(frozen=True, slots=True)
class Policy:
    concurrency: int
    ready_concurrency: int
    crash_after_failures: int
    plan_wait: timedelta
    ready_on_deadline: bool
    min_verified_fraction: float
    warm: bool = True
    """False: the replica turns ready as soon as its engine answers, and plans are refused."""


def _verified(outcome: Outcome, plan: WarmPlanIssued) -> str:
    done = len(outcome.verified) + outcome.already_held
    total = outcome.needed + outcome.already_held
    if total == 0:
        # The planner's own reason for an empty plan, when it gave one, says more than the count.
        return f"nothing to warm: {plan.empty_reason or 'the plan holds no cacheable prefix'}"
    return f"warm verified: {done} of {total} prefixes held"


def _within(items: list[WarmItem], limit_tokens: int | None) -> list[WarmItem]:
    """The leading `items` whose tokens add up to at most `limit_tokens` (all of them without a limit)."""
    if limit_tokens is None:
        return items
    kept, used = [], 0
    for item in items:
        if used + item.tokens > limit_tokens:
            break
        kept.append(item)
        used += item.tokens
    return kept


def held_key(plan: WarmPlanIssued, item: WarmItem) -> HeldKey:
    return (item.tenant, plan.model.name, item.prompt_rev, item.epoch_in(plan.epoch), item.prefix_id)


@dataclass
class ReplicaTracker:
    """The state of one replica; every method takes `now` and returns the transitions to publish."""

    replica: str
    policy: Policy
    new_id: Callable[[], uuid.UUID]
    phase: Phase = Phase.STARTING
    incarnation: uuid.UUID | None = None
    ready: bool = False
    partial: bool = False
    reason: str = "not started"
    held: set[HeldKey] = field(default_factory=set)
    running: WarmPlanIssued | None = None
    last_outcome: Outcome | None = None
    _pending: deque[WarmPlanIssued] = field(default_factory=deque)
    _seen: deque[uuid.UUID] = field(default_factory=deque)
    _seen_set: set[uuid.UUID] = field(default_factory=set)
    _epoch_floor: dict[tuple[str, str], int] = field(default_factory=dict)
    _failures: int = 0
    _loaded_at: datetime | None = None
    _planned: bool = False
    _awaiting: WarmPlanIssued | None = None

    def start(self, reason: str = "warmer started") -> list[Transition]:
        """Begin a new incarnation (the engine process is starting): forget plans and residency."""
        self.incarnation = self.new_id()
        self.held.clear()
        self._pending.clear()
        self.running = self._awaiting = None
        self._planned = False
        self._loaded_at = None
        self._failures = 0
        return [self._to(Phase.STARTING, reason, ready=False, event_id=self.incarnation)]

    def health(self, ok: bool, now: datetime) -> list[Transition]:
        """A health check's answer. Loads a starting replica, fails one that stopped answering, and starts
        a new incarnation for a failed one that answers again."""
        if self.leaving:
            return []
        if ok:
            self._failures = 0
            if self.phase is Phase.FAILED:
                return [*self.start("engine answers again"), *self.health(True, now)]
            return self._loaded(now) if self.phase is Phase.STARTING else []
        if self.phase in (Phase.STARTING, Phase.FAILED):
            return []
        self._failures += 1
        if self._failures < self.policy.crash_after_failures:
            return []
        self.held.clear()
        self._pending.clear()
        self._awaiting = None
        reason = f"engine stopped answering: {self._failures} health checks failed"
        return [self._to(Phase.FAILED, reason, ready=False)]

    @property
    def leaving(self) -> bool:
        """Whether the replica is draining or stopped: it is on its way out, for good."""
        return self.phase in (Phase.DRAINING, Phase.STOPPED)

    def drain(self, reason: str) -> list[Transition]:
        """Take the replica out of service: no longer ready, no plan runs or waits. Once only."""
        if self.leaving:
            return []
        self._pending.clear()
        self.running = self._awaiting = None
        return [self._to(Phase.DRAINING, reason, ready=False)]

    def stop(self, reason: str) -> list[Transition]:
        """The drained replica is gone (its in-flight requests done, or the wait for them over)."""
        if self.phase is Phase.STOPPED:
            return []
        transitions = self.drain(reason)
        self.held.clear()
        return [*transitions, self._to(Phase.STOPPED, reason, ready=False)]

    def _loaded(self, now: datetime) -> list[Transition]:
        self._loaded_at = now
        loading = self._to(Phase.LOADING, "weights loaded: /health answers", ready=False)
        if not self.policy.warm:
            return [loading, self._to(Phase.READY, "warming is off: serving cold", ready=True)]
        return [loading]

    def offer(self, plan: WarmPlanIssued, now: datetime) -> Decision:
        """Accept `plan` for this replica, or say why not. Accepting only queues it (`next_run`).

        Epochs are per (tenant, model): items of an epoch older than one already accepted for their
        tenant and model are left out; a plan left with none of its items is refused.
        """
        if (refusal := self._refusal(plan, now)) is not None:
            return Decision(False, refusal)
        model = plan.model.name
        fresh = [
            i for i in plan.items if i.epoch_in(plan.epoch) >= self._epoch_floor.get((i.tenant, model), 0)
        ]
        if plan.items and not fresh:
            item = plan.items[0]
            floor = self._epoch_floor[(item.tenant, model)]
            return Decision(
                False, f"epoch {item.epoch_in(plan.epoch)} is older than epoch {floor} already planned"
            )
        for item in fresh:
            key = (item.tenant, model)
            self._epoch_floor[key] = max(self._epoch_floor.get(key, 0), item.epoch_in(plan.epoch))
        stale = len(plan.items) - len(fresh)
        self._pending.append(msgspec.structs.replace(plan, items=fresh) if stale else plan)
        self._planned = True
        return Decision(True, f"accepted; {stale} items of an older epoch left out" if stale else "accepted")

    def _refusal(self, plan: WarmPlanIssued, now: datetime) -> str | None:
        """Why `plan` is refused before its items are looked at, if it is."""
        if not self.policy.warm:
            return "warming is off on this warmer (readiness.warm is false)"
        if plan.plan_id in self._seen_set:
            return "duplicate: this plan was already received"
        self._remember(plan.plan_id)
        if plan.deadline <= now:
            return f"expired: its deadline {plan.deadline.isoformat()} has passed"
        trigger = plan.trigger_event_id
        if trigger is not None and trigger != self.incarnation:
            return "issued for an earlier start of this replica"
        return _REFUSED_IN.get(self.phase)

    def next_run(self, fill_limit_tokens: int | None = None) -> RunOrder | None:
        """The next accepted plan to run, once the engine answers and nothing else runs for it.

        With `fill_limit_tokens` (a share of the engine's KV cache), the plan's items (most valuable
        first) are cut where their tokens would pass it: a warm set larger than the cache evicts its own
        beginning. What is cut is `left_out` and does not count against readiness.
        """
        if self.running is not None or not self._pending:
            return None
        if self.phase not in (Phase.LOADING, Phase.WARMING, Phase.READY):
            return None
        plan = self._pending.popleft()
        self.running = plan
        todo = [item for item in plan.items if plan.rewarm or held_key(plan, item) not in self.held]
        held = len(plan.items) - len(todo)
        kept = _within(todo, fill_limit_tokens)
        transitions = []
        if self.phase is Phase.LOADING:
            transitions.append(self._to(Phase.WARMING, f"warming plan {plan.plan_id}", ready=False))
        concurrency = self.policy.ready_concurrency if self.ready else self.policy.concurrency
        return RunOrder(plan, kept, held, concurrency, transitions, left_out=len(todo) - len(kept))

    def finished(self, outcome: Outcome, now: datetime) -> list[Transition]:
        """A run ended. Ready if it verified enough; otherwise wait for its deadline (`tick`)."""
        plan = self.running
        if plan is None or plan.plan_id != outcome.plan_id:
            return []  # a run of an earlier incarnation
        self.running = None
        self.last_outcome = outcome
        if self.phase is Phase.FAILED:
            return []  # what it verified died with the engine
        self.held.update(outcome.verified)
        verified = outcome.fraction >= self.policy.min_verified_fraction
        if self.phase is Phase.READY and self.partial and verified:
            # A replica serving on a partial warm whose later plan verified: ready again, now in full.
            return [
                self._to(
                    Phase.READY, f"{_verified(outcome, plan)} (after serving partially warm)", ready=True
                )
            ]
        if self.phase is not Phase.WARMING:
            return []
        if verified:
            return [self._to(Phase.READY, _verified(outcome, plan), ready=True)]
        self._awaiting = plan
        return self.tick(now)

    def forget(self, keys: Iterable[HeldKey]) -> None:
        """`keys` are no longer held (the engine evicted them): a later plan warms them again."""
        self.held.difference_update(keys)

    def overdue(self, now: datetime) -> uuid.UUID | None:
        """The running plan's id once its deadline passed: the service stops that run."""
        if self.running is not None and self.running.deadline <= now:
            return self.running.plan_id
        return None

    def tick(self, now: datetime) -> list[Transition]:
        """Apply the clock: a plan wait or deadline that passed turns the replica ready under the policy."""
        waited = now - self._loaded_at if self._loaded_at is not None else None
        if self.phase is Phase.LOADING and not self._planned and waited and waited >= self.policy.plan_wait:
            seconds = self.policy.plan_wait.total_seconds()
            return self._partial(f"no plan arrived within {seconds:g} s: serving cold")
        awaiting = self._awaiting
        if self.phase is Phase.WARMING and awaiting is not None and awaiting.deadline <= now:
            if not self.policy.ready_on_deadline:
                return []
            outcome = self.last_outcome
            held = 0 if outcome is None else len(outcome.verified) + outcome.already_held
            total = 0 if outcome is None else outcome.needed + outcome.already_held
            stopped = f" ({outcome.stopped})" if outcome is not None and outcome.stopped else ""
            return self._partial(f"deadline passed with {held} of {total} prefixes verified{stopped}")
        return []

    def _partial(self, reason: str) -> list[Transition]:
        self._awaiting = None
        transition = self._to(Phase.READY, reason, ready=True)
        self.partial = True
        return [transition]

    def _to(self, phase: Phase, reason: str, *, ready: bool, event_id: uuid.UUID | None = None) -> Transition:
        self.phase = phase
        self.ready = ready
        self.partial = False
        self.reason = reason
        return Transition(phase, reason, event_id or self.new_id())

    def _remember(self, plan_id: uuid.UUID) -> None:
        self._seen.append(plan_id)
        self._seen_set.add(plan_id)
        if len(self._seen) > _REMEMBERED_PLANS:
            self._seen_set.discard(self._seen.popleft())


def policy_from(
    *,
    concurrency: int,
    ready_concurrency: int,
    crash_after_failures: int,
    plan_wait_s: float,
    on_deadline: Literal["ready_partial", "stay_unready"],
    min_verified_fraction: float,
    warm: bool = True,
) -> Policy:
    return Policy(
        concurrency=concurrency,
        ready_concurrency=ready_concurrency,
        crash_after_failures=crash_after_failures,
        plan_wait=timedelta(seconds=plan_wait_s),
        ready_on_deadline=on_deadline == "ready_partial",
        min_verified_fraction=min_verified_fraction,
        warm=warm,
    )


def keys_of(plan: WarmPlanIssued, items: Iterable[WarmItem]) -> frozenset[HeldKey]:
    return frozenset(held_key(plan, item) for item in items)
