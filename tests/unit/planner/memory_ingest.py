"""An in-memory twin of the planner's ingest store (`ingestor.IngestStore`; `pg_store.PgIngestStore` is the
real one), for unit tests: partitions' positions, fenced as Postgres fences them, a ledger of the ids each
batch counted, and the batch's effects on what choosing reads, written into a `MemoryPlans`.

Misses, heartbeats and the per-replica counts are not kept: no read of the twin shows them.
`tests/ingest_store_behaviour.py` and `tests/choice_store_behaviour.py` hold it to Postgres."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime

import asyncpg
import msgspec

from tests.unit.planner.memory_planner import MemoryPlans
from warmplane.services.planner.core.ingest_batch import IngestBatch, Scope, newer_report
from warmplane.services.planner.ingestor import Partition
from warmplane.services.planner.pg_store import Fenced, PartitionSlice
from warmplane.services.planner.plan_choice import LiveReplica
from warmplane.shared.events import EpochBumped, Event, ReplicaEvent, WarmFinished
from warmplane.shared.plan_states import plan_state


class MemoryIngest:
    """Applies batches to `plans`; `batches` are those written, in order."""

    def __init__(self, plans: MemoryPlans | None = None, bucket_seconds: int = 60) -> None:
        self.plans = plans if plans is not None else MemoryPlans()
        self.bucket_seconds = bucket_seconds
        self.offsets: dict[Partition, int] = {}
        """Each partition's next offset to count."""
        self.ledger: dict[Partition, list[tuple[int, list[int]]]] = {}
        """Each partition's batches: their first offset and the ids they counted."""
        self.batches: list[IngestBatch] = []
        self._since: dict[str, datetime] = {}
        """Replica -> when its row's state began."""

    async def write(self, slices: Sequence[PartitionSlice], batch: IngestBatch) -> None:
        """As `PgIngestStore.write`: `Fenced` (naming every partition of the batch) unless each partition
        stands where its slice expects; asyncpg's `DataError` if a value holds a NUL. Nothing written then,
        but the batch's scopes, made before."""
        ids = self._scope_ids(batch.scopes())
        if any(self.offsets.get((s.topic, s.partition)) != s.expected_next for s in slices):
            raise Fenced({(s.topic, s.partition) for s in slices})
        if _unstorable(batch):
            raise asyncpg.UntranslatableCharacterError("unsupported Unicode escape sequence")
        for s in slices:
            self.offsets[(s.topic, s.partition)] = s.last_offset + 1
            self.ledger.setdefault((s.topic, s.partition), []).append((s.first_offset, list(s.event_ids)))
        self.batches.append(batch)
        self._count(batch, ids)
        for event in batch.replica_events:
            self._record_replica(event)
        for change in batch.fleet_changes:
            if isinstance(change, EpochBumped):
                key = (change.tenant, change.model.name)
                if key not in self.plans.epochs or self.plans.epochs[key] < change.epoch:
                    self.plans.epochs[key] = change.epoch
        self._record_results(batch)
        for report in batch.residency.values():
            stored = self.plans.reports.get(report.replica)
            if stored is None or newer_report(stored, report) is report:
                self.plans.reports[report.replica] = report

    async def positions(
        self, partitions: Sequence[Partition], window: int
    ) -> Mapping[Partition, tuple[int, Sequence[uuid.UUID]]]:
        found: dict[Partition, tuple[int, Sequence[uuid.UUID]]] = {}
        for partition in partitions:
            if partition in self.offsets:
                counted = [i for _first, ids in sorted(self.ledger[partition]) for i in ids]
                recent = counted[max(0, len(counted) - window) :]
                found[partition] = (self.offsets[partition], [uuid.UUID(int=i) for i in recent])
        return found

    async def rejected(
        self, batch_of: Callable[[list[Event]], IngestBatch], events: list[Event]
    ) -> list[int]:
        self._scope_ids(batch_of(events).scopes())
        return [index for index, event in enumerate(events) if _unstorable(batch_of([event]))]

    def _scope_ids(self, scopes: set[Scope]) -> dict[Scope, int]:
        known = {scope: scope_id for scope_id, scope in self.plans.scopes.items()}
        for scope in sorted(scopes - known.keys()):
            known[scope] = max(self.plans.scopes, default=0) + 1
            self.plans.scopes[known[scope]] = scope
        return known

    def _count(self, batch: IngestBatch, ids: dict[Scope, int]) -> None:
        """Requests per (scope, leaf, bucket), chain nodes (the first stands) and payloads (the first
        stands)."""
        plans, requests = self.plans, batch.requests
        for scope, leaf, at in zip(requests.scopes, requests.leaves, requests.seconds, strict=True):
            # Postgres buckets the whole seconds, truncated toward zero, floor-divided by the width.
            plans.counts.append((ids[scope], leaf, int(at) // self.bucket_seconds, 1))
        nodes = {(s, p) for s, p, _parent, _tokens in plans.prefixes}
        for (scope, prefix), edge in batch.edges().items():
            if (ids[scope], prefix) not in nodes:
                nodes.add((ids[scope], prefix))
                plans.prefixes.append((ids[scope], prefix, edge.parent_id, edge.tokens))
        for (scope, prefix), entry in batch.catalog.items():
            plans.payload_of.setdefault((ids[scope], prefix), entry.payload)
            if plans.catalogued is not None:
                plans.catalogued.add((ids[scope], prefix))

    def _record_replica(self, event: ReplicaEvent) -> None:
        """The latest occurrence decides the state; a capacity is kept from the latest event with one."""
        plans, replica, at = self.plans, event.replica, event.occurred_at
        if event.STATE == "starting" and (replica not in plans.starts or plans.starts[replica][0] < at):
            plans.starts[replica] = (at, event.event_id)
        index = next((i for i, row in enumerate(plans.live) if row.replica == replica), None)
        old = plans.live[index] if index is not None else None
        newer = old is None or replica not in self._since or self._since[replica] <= at
        capacity = event.kv_capacity_tokens
        if old is not None and (capacity is None or not (old.kv_capacity_tokens is None or newer)):
            capacity = old.kv_capacity_tokens
        if newer:
            row = LiveReplica(replica, event.node, event.model.revision, event.STATE, capacity)
            plans.model_of[replica], self._since[replica] = event.model.name, at
        else:
            assert old is not None
            row = replace(old, kv_capacity_tokens=capacity)
        if index is None:
            plans.live.append(row)
        else:
            plans.live[index] = row

    def _record_results(self, batch: IngestBatch) -> None:
        """A recorded plan is `warming` while it progresses, then its first outcome stands."""
        recorded = {plan.plan_id for plan in self.plans.rows.values()}
        for result in batch.plan_results:
            if result.plan_id not in recorded:
                continue
            state, finished = self.plans.outcomes.get(result.plan_id, ("issued", None))
            if isinstance(result, WarmFinished):
                if finished is None:
                    self.plans.outcomes[result.plan_id] = (plan_state(result), result.occurred_at)
            elif state in ("issued", "warming"):
                self.plans.outcomes[result.plan_id] = ("warming", None)


def _unstorable(batch: IngestBatch) -> bool:
    """Whether Postgres would refuse a value of `batch`: a NUL in a string, which neither `text` nor
    `jsonb` holds (request and miss names are refused by their decoder)."""
    written = (
        [entry.payload for entry in batch.catalog.values()],
        batch.replica_events,
        batch.fleet_changes,
        batch.plan_results,
        list(batch.residency.values()),
    )
    return _holds_nul(msgspec.to_builtins(written))


def _holds_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_nul(item) for item in value)
    return False
