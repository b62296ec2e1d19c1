"""Folding a batch of decoded events into what one database transaction applies. Pure: no I/O.

A batch becomes: the columns of its requests and misses (one entry per event, which Postgres sums per
(scope, prefix, time bucket), and a request's also per (replica, scope, time bucket), in the batch's one
statement), the new ends of chains not yet known to be stored (packed by scope, as they are stored),
catalog payloads, replica transitions, fleet changes, warm results (which move the state of the plans
they answer) and each replica's latest residency report in the batch.

The fold runs once per event at fleet rates, so its per-event work is column extraction in list
comprehensions and set operations in C; the summing moved to Postgres, on the other core (a
dictionary of counters per key here cost 1.6 us an event: bench/ingest_bench.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from datetime import datetime

from warmplane.shared.chain_nodes import ChainNodes
from warmplane.shared.events import (
    DeployFinished,
    DeployStarted,
    EpochBumped,
    Event,
    FleetScaled,
    PrefixMissed,
    PrefixPayload,
    ReplicaEvent,
    ReplicaHeartbeat,
    ReplicaResidency,
    ReplicaRewarmRequested,
    RequestObserved,
    WarmFinished,
    WarmProgressed,
)

Scope = tuple[str, str, str]
"""(tenant, model name, prompt revision): what prefix ids are namespaced by."""
ScopedPrefix = tuple[Scope, int]
"""A prefix id in its scope, as ingestion folds them (the store keys them by scope id: `NodeKey`)."""
StoredNodes = Mapping[Scope, Set[int]]
"""Chain nodes known to be stored, as prefix ids by scope (`node_cache.NodeCache.by_scope`)."""
_NONE_STORED: Set[int] = frozenset()
FLEET_TYPES = (DeployStarted, DeployFinished, FleetScaled, EpochBumped, ReplicaRewarmRequested)
_timestamp = datetime.timestamp


@dataclass(slots=True)
class RequestColumns:
    """The batch's requests, one entry per request in every list, in batch order.

    `seconds` is `occurred_at` in Unix seconds (the store buckets it); `ttft_ms` is None where the
    request reported none; `replicas` names the replica that served each; `leaf_added` whether the
    request's leaf is a node this batch's `chains` add (not known stored before it). Summed per
    (replica, scope, bucket) by Postgres, and per (scope, leaf, bucket) where the leaf is not added
    (an added leaf's requests are kept with its chain row: migration 0017).
    """

    scopes: list[Scope] = field(default_factory=list)
    leaves: list[int] = field(default_factory=list)
    replicas: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)
    ttft_ms: list[float | None] = field(default_factory=list)
    leaf_added: list[bool] = field(default_factory=list)


@dataclass(slots=True)
class MissColumns:
    """The batch's misses, one entry per miss: the first chain element that was not resident, and the
    tokens missed (`chain_tokens[-1] - cached_tokens`, at least 0). Summed per (scope, prefix, bucket)."""

    scopes: list[Scope] = field(default_factory=list)
    prefixes: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    missed_tokens: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ChainEdge:
    """A prefix's parent (None at the root), its depth and its cumulative token count."""

    parent_id: int | None
    depth: int
    tokens: int


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    payload: PrefixPayload
    tokens: int
    seen_at: datetime


@dataclass(slots=True)
class IngestBatch:
    """Everything one batch changes (its events were de-duplicated before they were folded)."""

    requests: RequestColumns = field(default_factory=RequestColumns)
    misses: MissColumns = field(default_factory=MissColumns)
    chains: dict[Scope, ChainNodes] = field(default_factory=dict)
    """The new ends of chains by scope: each request's nodes below the deepest one known stored, parents
    first, gathered as `prefix_chains` stores them (a row a batch and scope)."""
    new_nodes: dict[Scope, set[int]] = field(default_factory=dict)
    """Every prefix `chains` holds, by scope: once they commit, known to be stored."""
    catalog: dict[ScopedPrefix, CatalogEntry] = field(default_factory=dict)
    replica_events: list[ReplicaEvent] = field(default_factory=list)
    fleet_changes: list[Event] = field(default_factory=list)
    plan_results: list[WarmProgressed | WarmFinished] = field(default_factory=list)
    heartbeats: dict[str, ReplicaHeartbeat] = field(default_factory=dict)
    """Each replica's newest heartbeat in the batch."""
    residency: dict[str, ReplicaResidency] = field(default_factory=dict)
    """Each replica's newest residency report in the batch (`newer_report`): a report replaces the whole
    of an earlier one, so the others would be overwritten in the same transaction."""
    ignored: int = 0

    @property
    def has_records(self) -> bool:
        """Whether the batch holds more than counters: rows written beside the batch's counts."""
        return any(
            (self.replica_events, self.heartbeats, self.fleet_changes, self.plan_results, self.residency)
        )

    def edges(self) -> dict[ScopedPrefix, ChainEdge]:
        """Every prefix `chains` adds, with its edge (for readers; the store writes `chains` packed)."""
        return {
            (scope, prefix): ChainEdge(parent, depth, tokens)
            for scope, nodes in self.chains.items()
            for prefix, parent, tokens, depth in nodes
        }

    def scopes(self) -> set[Scope]:
        found = set(self.requests.scopes)
        found.update(self.misses.scopes)
        found.update(self.chains)
        found.update(key[0] for key in self.catalog)
        return found


def fold_events(events: Iterable[Event], *, stored_nodes: StoredNodes) -> IngestBatch:
    """Fold `events` into one batch.

    `stored_nodes` holds chain nodes already known to be in the database, whose edges need not be
    written again (a cache: forgetting a node costs a redundant write, never a wrong count; remembering
    one whose row was swept would cost a broken chain, which `node_cache.NodeCache`'s age bound rules
    out). Events the planner
    does not ingest (plans) are counted in `ignored`.
    """
    batch = IngestBatch()
    events = list(events)
    # The common case by class identity, in comprehensions: a loop dispatching each event cost more.
    requests = [e for e in events if type(e) is RequestObserved]
    if requests:
        _fold_requests(batch, requests, stored_nodes)
    if len(requests) == len(events):
        return batch
    misses: list[PrefixMissed] = []
    for event in events:
        if type(event) is RequestObserved:
            continue
        if isinstance(event, PrefixMissed):
            misses.append(event)
        elif isinstance(event, ReplicaEvent):
            batch.replica_events.append(event)
        elif isinstance(event, FLEET_TYPES):
            batch.fleet_changes.append(event)
        elif isinstance(event, WarmProgressed | WarmFinished):
            batch.plan_results.append(event)
        elif isinstance(event, ReplicaHeartbeat | ReplicaResidency):
            _keep_newest(batch, event)
        else:
            batch.ignored += 1
    if misses:
        _fold_misses(batch.misses, misses)
    return batch


def _keep_newest(batch: IngestBatch, event: ReplicaHeartbeat | ReplicaResidency) -> None:
    """Keep of each replica's heartbeats the latest, and of its residency reports the one that stands."""
    if isinstance(event, ReplicaHeartbeat):
        beat = batch.heartbeats.get(event.replica)
        if beat is None or beat.occurred_at < event.occurred_at:
            batch.heartbeats[event.replica] = event
        return
    kept = batch.residency.get(event.replica)
    batch.residency[event.replica] = event if kept is None else newer_report(kept, event)


def newer_report(a: ReplicaResidency, b: ReplicaResidency) -> ReplicaResidency:
    """The report that stands of two about one replica: the later `occurred_at` (the warmer's clock), and
    on a tie the larger event id (UUIDv7: the later one made), so every order of arrival keeps the same.
    The store applies the same rule against the stored row."""
    return a if (a.occurred_at, a.event_id) >= (b.occurred_at, b.event_id) else b


def _fold_requests(batch: IngestBatch, events: list[RequestObserved], stored: StoredNodes) -> None:
    columns = batch.requests
    scopes = columns.scopes = [(e.tenant, e.model.name, e.prompt_rev) for e in events]
    leaves = columns.leaves = [e.chain[-1] for e in events]
    columns.replicas = [e.replica for e in events]
    columns.seconds = [_timestamp(e.occurred_at) for e in events]
    columns.prompt_tokens = [e.prompt_tokens for e in events]
    columns.cached_tokens = [e.cached_tokens for e in events]
    columns.ttft_ms = [e.ttft_ms for e in events]
    new_nodes, chains = batch.new_nodes, batch.chains
    columns.leaf_added = []
    added = columns.leaf_added.append
    # In batch order: the first request to carry an unknown node records it, and later ones find it new.
    # Inline, and straight into the packed columns: a chat request adds about 15 nodes (fold_bench).
    for event, scope, leaf in zip(events, scopes, leaves, strict=True):
        known = stored.get(scope, _NONE_STORED)
        new = new_nodes.get(scope)
        if new is None:
            new = new_nodes[scope] = set()
        if leaf in known:
            added(False)
            continue
        added(True)  # by an earlier request of the batch, or by this one, below
        if leaf in new:
            continue
        # Walk from the leaf up: once a node is known to be stored (or added here), so are its ancestors.
        chain = event.chain
        depth = len(chain) - 2
        while depth >= 0 and (node := chain[depth]) not in known and node not in new:
            depth -= 1
        fresh = chain[depth + 1 :]
        nodes = chains.get(scope)
        if nodes is None:
            nodes = chains[scope] = ChainNodes()
        nodes.add_run(chain[depth] if depth >= 0 else None, depth + 1, fresh, event.chain_tokens[depth + 1 :])
        new.update(fresh)
    for scope in [scope for scope, new in new_nodes.items() if not new]:
        del new_nodes[scope]
    payloads = [e.payload for e in events]
    if payloads.count(None) < len(payloads):
        for event, scope, payload in zip(events, scopes, payloads, strict=True):
            if payload is not None:
                # The contract guarantees the payload's prefix is on the chain.
                tokens = event.chain_tokens[event.chain.index(payload.prefix_id)]
                batch.catalog[(scope, payload.prefix_id)] = CatalogEntry(payload, tokens, event.occurred_at)


def _fold_misses(columns: MissColumns, events: list[PrefixMissed]) -> None:
    columns.scopes = [(e.tenant, e.model.name, e.prompt_rev) for e in events]
    columns.prefixes = [e.chain[min(e.resident_depth, len(e.chain) - 1)] for e in events]
    columns.seconds = [_timestamp(e.occurred_at) for e in events]
    columns.missed_tokens = [max(0, e.chain_tokens[-1] - e.cached_tokens) for e in events]
