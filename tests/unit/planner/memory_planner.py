"""In-memory twins of the planner's plan and fleet stores and its publisher, for unit tests (no sockets).
`MemoryIngest` (memory_ingest.py) writes into a `MemoryPlans` what ingestion writes into Postgres."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from warmplane.services.planner.core.chains_read import ChainsNeeded
from warmplane.services.planner.core.deploy_epochs import EpochState, Revisions
from warmplane.services.planner.core.ingest_batch import Scope
from warmplane.services.planner.plan_choice import HeldItem, LiveReplica, ModelStatistics
from warmplane.services.planner.plans import Unplanned
from warmplane.services.planner.policy.replica_plan import NodeKey
from warmplane.shared.chain_nodes import ChainNodes
from warmplane.shared.events import (
    LIVE_REPLICA_STATES,
    EpochBumped,
    Event,
    ModelRef,
    PrefixPayload,
    ReplicaResidency,
    WarmFinished,
    WarmPlanIssued,
)
from warmplane.shared.plan_states import PlanState

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
BUCKET = int(NOW.timestamp()) // 60
MODEL = ModelRef("m", "r1")


class MemoryPlans:
    """Prefixes are (scope, id, parent, tokens); `counts` are (scope, leaf, bucket, requests), summed per key
    when read; a scope given here belongs to tenant `tenant-s` of model `m`, prompt revision v1."""

    def __init__(
        self,
        prefixes: Sequence[tuple[int, int, int | None, int]] = (),
        counts: Sequence[tuple[int, int, int, int]] = (),
        payloads: dict[NodeKey, PrefixPayload] | None = None,
    ) -> None:
        self.prefixes = list(prefixes)
        self.counts = list(counts)
        self.scopes: dict[int, Scope] = {
            s[0]: (f"tenant-{s[0]}", MODEL.name, "v1") for s in [*prefixes, *counts]
        }
        """Scope id -> (tenant, model, prompt revision)."""
        self.payload_of = payloads or {}
        self.catalogued: set[NodeKey] | None = None
        """Defaults to the keys of `payloads`."""
        self.rows: dict[tuple[uuid.UUID, str], WarmPlanIssued] = {}
        self.outcomes: dict[uuid.UUID, tuple[PlanState, datetime | None]] = {}
        """Plan id -> its state past `issued` and when it finished."""
        self.asked: list[tuple[str, int]] = []
        self.positions: dict[tuple[str, int], int] | None = None
        """What a read says the planner's group had counted to (`ModelStatistics.positions`)."""
        self.during_read: list[Callable[[], object]] = []
        """Called inside the next read, before it looks: what commits while a read is under way."""
        self.fail = False
        self.epochs: dict[tuple[str, str], int] = {}
        """(tenant, model) -> epoch."""
        self.live: list[LiveReplica] = []
        """Every replica as its row stands, whatever its state: `live_replicas` keeps the live ones."""
        self.model_of: dict[str, str] = {}
        """Replica -> the model it serves; absent: `MODEL`'s."""
        self.starts: dict[str, tuple[datetime, uuid.UUID]] = {}
        """Replica -> its latest start: when, and the start's event id (its incarnation)."""
        self.reports: dict[str, ReplicaResidency] = {}
        """Replica -> the residency report that stands."""
        self.holding: dict[str, list[HeldItem]] = {}
        """What a replica holds besides what its report and verified plans say: set by a test outright."""
        self.published: dict[uuid.UUID, datetime] = {}
        self.unplanned: list[Unplanned] = []

    async def statistics(
        self, model: str, since_bucket: int, max_nodes: int | None = None
    ) -> ModelStatistics:
        if self.fail:
            raise OSError("connection reset")
        self.asked.append((model, since_bucket))
        while self.during_read:
            self.during_read.pop(0)()
        of_model = {scope for scope, (_tenant, name, _rev) in self.scopes.items() if name == model}
        summed = Counter[tuple[int, int, int]]()
        for scope, leaf, bucket, requests in self.counts:
            if scope in of_model and bucket >= since_bucket:
                summed[(scope, leaf, bucket)] += requests
        counts = [(*key, requests) for key, requests in summed.items() if requests > 0]
        # As Postgres: the leaves most recently counted first, only the nodes on their chains, within
        # `max_nodes`; a scope without a count since has nothing to plan from, and none of it is read.
        latest: dict[NodeKey, tuple[int, int]] = {}
        for scope, leaf, bucket, requests in counts:
            last, total = latest.get((scope, leaf), (bucket, 0))
            latest[(scope, leaf)] = (max(last, bucket), total + requests)
        leaves = sorted(latest, key=lambda key: (-latest[key][0], -latest[key][1], key))
        chains = ChainsNeeded(leaves)
        while True:  # each node a row of its own, in any order: a round a level, until none resolves more
            wanted = chains.unresolved()
            for scope, prefix, parent, tokens in self.prefixes:
                node = ChainNodes()
                node.add_run(parent, 0, [prefix], [tokens])
                chains.take(scope, node)
            if chains.unresolved() == wanted:
                break
        prefixes, taken = chains.bounded(leaves, max_nodes)
        counts = [count for count in counts if (count[0], count[1]) in taken]
        catalogued = self.catalogued if self.catalogued is not None else set(self.payload_of)
        held = {(scope, prefix.prefix_id) for scope, prefix in prefixes}
        return ModelStatistics(
            prefixes,
            counts,
            {key for key in catalogued if key in held},
            None if self.positions is None else dict(self.positions),
        )

    async def payloads(self, keys: Sequence[NodeKey]) -> dict[NodeKey, PrefixPayload]:
        return {key: self.payload_of[key] for key in keys if key in self.payload_of}

    async def scope_names(self, scope_ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        return {s: (self.scopes[s][0], self.scopes[s][2]) for s in scope_ids if s in self.scopes}

    async def current_epochs(self, model: str) -> dict[str, int]:
        return {tenant: epoch for (tenant, of), epoch in self.epochs.items() if of == model}

    async def live_replicas(self, model: str) -> list[LiveReplica]:
        live = [
            r
            for r in self.live
            if r.state in LIVE_REPLICA_STATES and self.model_of.get(r.replica, MODEL.name) == model
        ]
        return sorted(live, key=lambda r: r.replica)

    async def held_by(self, replicas: Sequence[str]) -> dict[str, list[HeldItem]]:
        """As `PgPlanStore.held_by`, then what `holding` adds."""
        return {replica: self._held(replica) for replica in replicas}

    def _held(self, replica: str) -> list[HeldItem]:
        found = dict.fromkeys(self._held_since_start(replica))
        found.update(dict.fromkeys(self.holding.get(replica, [])))
        return list(found)

    def _held_since_start(self, replica: str) -> list[HeldItem]:
        """The report on the replica's latest start, and the items of its verified plans, from the one
        answering that start on, that finished after the report (any, without one)."""
        if (start := self.starts.get(replica)) is None:
            return []
        report = self.reports.get(replica)
        if report is not None and report.incarnation != start[1]:
            report = None  # a report on an earlier start says nothing of this one
        held = [HeldItem(p, h.tenant, h.epoch) for h in report.held for p in h.prefix_ids] if report else []
        if (answered := self.rows.get((start[1], replica))) is None:
            return held
        for plan in self.rows.values():
            state, finished = self.outcomes.get(plan.plan_id, ("issued", None))
            if (
                plan.replica == replica
                and state == "verified"
                and plan.occurred_at >= answered.occurred_at
                and (report is None or (finished is not None and finished > report.occurred_at))
            ):
                held += [HeldItem(i.prefix_id, i.tenant, i.epoch_in(plan.epoch)) for i in plan.items]
        return held

    async def record(self, plans: Sequence[tuple[WarmPlanIssued, uuid.UUID]]) -> set[uuid.UUID]:
        return {
            plan.plan_id
            for plan, trigger in plans
            if self.rows.setdefault((trigger, plan.replica), plan) is plan
        }

    async def mark_published(self, plan_ids: Sequence[uuid.UUID], at: datetime) -> None:
        for plan_id in plan_ids:
            self.published.setdefault(plan_id, at)

    async def unpublished(self, *, issued_before: datetime, alive_at: datetime) -> list[WarmPlanIssued]:
        waiting = [
            plan
            for plan in self.rows.values()
            if plan.plan_id not in self.published
            and plan.occurred_at < issued_before
            and plan.deadline > alive_at
        ]
        return sorted(waiting, key=lambda plan: plan.occurred_at)

    async def unplanned_starts(self, *, since: datetime, before: datetime) -> list[Unplanned]:
        planned = {trigger for trigger, _replica in self.rows}
        return [start for start in self.unplanned if start.trigger not in planned]

    async def standing(self, results: Sequence[WarmFinished]) -> list[WarmFinished]:
        return list(results)


class MemoryFleet:
    """Epochs shared with a `MemoryPlans` (its `epochs`), tenants with traffic for `model` given by
    `tenants` (others by `traffic`), alarms as rows."""

    def __init__(self, plans: MemoryPlans, tenants: Sequence[str], model: str = MODEL.name) -> None:
        self.plans = plans
        self.seen: set[tuple[str, str]] = {(tenant, model) for tenant in tenants}
        """(tenant, model) pairs with traffic."""
        self.deployed: dict[tuple[str, str], Revisions] = {}
        self.bumps: dict[uuid.UUID, tuple[EpochBumped, datetime | None]] = {}
        self.alarms: list[dict[str, object]] = []

    async def traffic(self, tenant: str, model: str) -> None:
        self.seen.add((tenant, model))

    async def epoch_states(self, model: str, tenant: str) -> list[EpochState]:
        if tenant:
            tenants = [tenant]
        else:
            tenants = sorted(
                {t for t, m in self.seen if m == model} | {t for t, m in self.plans.epochs if m == model}
            )
        return [
            EpochState(t, self.plans.epochs.get((t, model), 0), self.deployed.get((t, model)))
            for t in tenants
        ]

    async def record_bump(self, bump: EpochBumped, deployed: Revisions, expected_epoch: int) -> bool:
        key = (bump.tenant, bump.model.name)
        if self.plans.epochs.get(key, 0) != expected_epoch:
            return False
        self.plans.epochs[key] = bump.epoch
        self.deployed[key] = deployed
        self.bumps = {i: (b, at) for i, (b, at) in self.bumps.items() if (b.tenant, b.model.name) != key}
        self.bumps[bump.event_id] = (bump, None)
        return True

    async def mark_bump_published(self, event_id: uuid.UUID, at: datetime) -> None:
        self.bumps[event_id] = (self.bumps[event_id][0], at)

    async def unpublished_bumps(self, before: datetime) -> list[EpochBumped]:
        return [bump for bump, at in self.bumps.values() if at is None and bump.occurred_at < before]

    async def open_alarm(
        self,
        model: str,
        *,
        window: tuple[datetime, datetime],
        requests: int,
        cold_requests: int,
        at: datetime,
    ) -> uuid.UUID | None:
        if any(a["model"] == model and a["cleared_at"] is None for a in self.alarms):
            return None
        alarm_id = uuid.uuid4()
        self.alarms.append(
            {"id": alarm_id, "model": model, "window": window, "requests": requests, "cold": cold_requests,
             "cleared_at": None, "planned": 0}
        )  # fmt: skip
        return alarm_id

    async def alarm_planned(self, alarm_id: uuid.UUID, replicas: int) -> None:
        for alarm in self.alarms:
            if alarm["id"] == alarm_id:
                alarm["planned"] = replicas

    async def clear_alarm(self, model: str, at: datetime) -> bool:
        cleared = False
        for alarm in self.alarms:
            if alarm["model"] == model and alarm["cleared_at"] is None:
                alarm["cleared_at"], cleared = at, True
        return cleared


class Published:
    """Plans and other events as the broker took them; `down` makes publishing fail."""

    def __init__(self) -> None:
        self.plans: list[WarmPlanIssued] = []
        self.events: list[Event] = []
        self.down = False

    async def publish(self, event: Event) -> None:
        if self.down:
            raise TimeoutError("the broker did not acknowledge in time")
        if isinstance(event, WarmPlanIssued):
            self.plans.append(event)
        else:
            self.events.append(event)
