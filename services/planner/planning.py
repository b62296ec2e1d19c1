"""The planning task: what committed batches trigger is planned here, off the ingest path.

The ingest writer puts each committed batch's triggers (`core/triggers.py`) and goes on writing; one task
takes them in order and awaits the handler registered for the trigger's type (the table is built where the
planner is wired, `bootstrap.py`). Ingestion never waits for a trie build.

**Coalescing.** A trigger put while one of its key waits is merged into that one (`merged`), which keeps its
place: several starts of one model become one fleet pass, a bump supersedes an older bump of its tenant and
model. So the queue holds at most one trigger a key, and its length grows with the fleet's models, tenants
and replicas, not with the traffic. A trigger taken is not merged into any more: one put meanwhile waits for
the next pass, which reads after it.

**Full.** When `depth` keys wait, `put` waits for room: the writer, and the consumer behind it, are held
back, as the writer's own queue holds the consumer back. A trigger is never dropped: the catch-up plans only
starts, so a dropped bump or deploy would never be planned.

**Fresh counts.** A trigger is put after its batch committed, and handlers read what they plan from when
they run: a plan never reads counts older than the batch that triggered it. The one read kept between
plans (`plan_choice`: starts within `statistics_max_age_s`) serves only starts put before it began
(`StartsToPlan.committed_at`).

**Urgent work first.** Some triggers have someone waiting on them: a replica that started waits for its plan
before it turns ready, a tenant whose epoch moved waits for its replicas' re-plans. Their types are `urgent`.
Ingestion shares the planner's event loop, its CPU and its Postgres with them, and under load a start's
plan took several times as long as idle (`bench.plan_latency_bench` measures both). So ingestion calls
`yield_to_urgent` before each batch: while an urgent trigger waits or is handled it pauses, for at most
`yield_s`, and after a pause it runs free for as long as it paused, so a stream of urgent work takes at most
half of ingestion's time. The broker holds what is not read meanwhile; counts lag by the pause, never lose
or double anything.

**Failures and shutdown.** A handler that raises is logged and counted (`plan_failures`), and the next
trigger is handled: the batches' counts stand. `drain` handles what waits, for at most its timeout (the
planner stops after its writer drained, so nothing is put after), then stops the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Hashable, Iterable, Mapping
from typing import Any, Protocol

from warmplane.services.planner.metrics import PlannerMetrics

log = logging.getLogger(__name__)
Handler = Callable[[Any], Awaitable[object]]


class Trigger(Protocol):
    """Work for the planning task (`core/triggers.py` holds the planner's)."""

    @property
    def key(self) -> Hashable:
        """Triggers of one key merge while they wait."""

    def merged(self, newer: Any) -> Any:
        """This trigger with `newer` (of the same type and key) folded in."""


class Planning:
    """A bounded queue of coalescing triggers and the task that hands each to its type's handler."""

    def __init__(
        self,
        handlers: Mapping[type, Handler],
        *,
        depth: int,
        metrics: PlannerMetrics,
        urgent: Collection[type] = (),
        yield_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, not {depth}")
        if yield_s < 0:
            raise ValueError(f"yield_s must not be negative, not {yield_s}")
        self._handlers = dict(handlers)
        self._depth = depth
        self._metrics = metrics
        self._urgent_types = frozenset(urgent)
        self._yield_s = yield_s
        self._clock = clock
        self._waiting: dict[Hashable, Trigger] = {}
        """Insertion-ordered: the oldest key first."""
        self._put_at: dict[Hashable, float] = {}
        """When each waiting key was first put (its wait is observed when it is taken)."""
        self._urgent = 0
        """Urgent triggers waiting or being handled."""
        self._free_until = -float("inf")
        """Ingestion does not yield before this (monotonic seconds): it runs as long as it last paused."""
        self._handling = False
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        """Triggers waiting (not the one being handled)."""
        return len(self._waiting)

    async def put(self, triggers: Iterable[Trigger]) -> None:
        """Queue `triggers` in order, each merged into a waiting one of its key, else waiting for room (module
        doc). Raises `LookupError` for a trigger type without a handler (a wiring mistake)."""
        for trigger in triggers:
            if type(trigger) not in self._handlers:
                raise LookupError(f"no planning handler for {type(trigger).__name__}")
            await self._put(trigger, trigger.key)

    async def _put(self, trigger: Trigger, key: Hashable) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: key in self._waiting or len(self._waiting) < self._depth)
            waiting = self._waiting.get(key)
            self._waiting[key] = trigger if waiting is None else waiting.merged(trigger)
            if waiting is None:
                self._put_at[key] = self._clock()
                if type(trigger) in self._urgent_types:
                    self._urgent += 1
            self._metrics.planning_waiting.set(len(self._waiting))
            self._changed.notify_all()

    async def yield_to_urgent(self) -> float:
        """Pause while urgent triggers wait or are handled, at most `yield_s`, and not again until ingestion
        has run as long as it paused (module doc); the seconds paused."""
        if not self._urgent or self._yield_s <= 0 or self._clock() < self._free_until:
            return 0.0
        began = self._clock()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._yield_s), self._changed:
                await self._changed.wait_for(lambda: not self._urgent)
        paused = self._clock() - began
        self._free_until = self._clock() + paused
        self._metrics.ingest_yielded_seconds.inc(paused)
        return paused

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="planner-planning")

    async def burst(self) -> int:
        """Handle what waits, and what handling puts, until nothing does; how many triggers were handled (for
        tests and tools that run no task)."""
        handled = 0
        while self._waiting:
            await self._handle(await self._take())
            handled += 1
        return handled

    async def drain(self, timeout_s: float) -> None:
        """Handle what waits, for at most `timeout_s`, then stop the task; what is left is logged (the
        catch-up of the next planner plans the starts among it)."""
        if self._task is None:
            return
        try:
            async with asyncio.timeout(timeout_s), self._changed:
                await self._changed.wait_for(lambda: not self._waiting and not self._handling)
        except TimeoutError:
            log.warning("planning stopped after %.0f s, %d triggers waiting", timeout_s, len(self._waiting))
        task, self._task = self._task, None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        while True:
            await self._handle(await self._take())

    async def _take(self) -> Trigger:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._waiting))
            key = next(iter(self._waiting))
            trigger = self._waiting.pop(key)
            queued = self._clock() - self._put_at.pop(key)
            self._metrics.planning_queued_seconds.labels(type(trigger).__name__).observe(queued)
            self._handling = True
            self._metrics.planning_waiting.set(len(self._waiting))
            self._changed.notify_all()
            return trigger

    async def _handle(self, trigger: Trigger) -> None:
        try:
            with self._metrics.planning_seconds.labels(type(trigger).__name__).time():
                await self._handlers[type(trigger)](trigger)
        except Exception:  # planning must go on: the next trigger, or the catch-up, plans (module doc)
            self._metrics.plan_failures.inc()
            log.exception("could not handle %s", type(trigger).__name__)
        finally:
            async with self._changed:
                self._handling = False
                if type(trigger) in self._urgent_types:
                    self._urgent -= 1
                self._changed.notify_all()
