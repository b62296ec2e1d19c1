"""Folding a batch of decoded events into the deltas one database transaction applies. Pure: no I/O.

A batch becomes: counter deltas per (scope, prefix, time bucket), the new ends of chains not yet known
to be stored, catalog payloads, replica transitions, fleet changes and warm results (which move the
state of the plans they answer). Counters are summed here so the
database sees one row per key per batch, not one per event.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from warmplane.shared.events import (
    DeployFinished,
    DeployStarted,
    EpochBumped,
    Event,
    FleetScaled,
    PrefixMissed,
    PrefixPayload,
    ReplicaEvent,
    RequestObserved,
    WarmFinished,
    WarmProgressed,
)

Scope = tuple[str, str, str]
"""(tenant, model name, prompt revision): what prefix ids are namespaced by."""
NodeKey = tuple[Scope, int]
FLEET_TYPES = (DeployStarted, DeployFinished, FleetScaled, EpochBumped)


@dataclass(slots=True)
class RequestCounts:
    requests: int = 0
    cold_requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft_ms_sum: float = 0.0
    ttft_count: int = 0


@dataclass(slots=True)
class MissCounts:
    misses: int = 0
    missed_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ChainEdge:
    """A prefix and its parent (None at the root), its depth and its cumulative token count."""

    parent_id: int | None
    depth: int
    tokens: int
    first_seen: datetime


@dataclass(frozen=True, slots=True)
class ChainPath:
    """The new end of a chain: `ids` (with cumulative `tokens`) hang in order below `anchor_id`, the
    deepest prefix already known (None: the chain is new from its root), starting at `first_depth`.

    One row per request instead of one per new prefix: a chat turn adds a dozen prefixes at once.
    """

    anchor_id: int | None
    first_depth: int
    ids: list[int]
    tokens: list[int]
    first_seen: datetime

    def edges(self) -> Iterator[tuple[int, ChainEdge]]:
        """Each new prefix with its edge."""
        parent = self.anchor_id
        for offset, (prefix, tokens) in enumerate(zip(self.ids, self.tokens, strict=True)):
            yield prefix, ChainEdge(parent, self.first_depth + offset, tokens, self.first_seen)
            parent = prefix


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    payload: PrefixPayload
    tokens: int
    seen_at: datetime


@dataclass(slots=True)
class IngestBatch:
    """Everything one batch changes (its events were de-duplicated before they were folded)."""

    request_counts: dict[tuple[Scope, int, int], RequestCounts] = field(default_factory=dict)
    miss_counts: dict[tuple[Scope, int, int], MissCounts] = field(default_factory=dict)
    paths: dict[NodeKey, ChainPath] = field(default_factory=dict)
    """New chain ends, keyed by their leaf."""
    new_nodes: set[NodeKey] = field(default_factory=set)
    """Every prefix the paths add: once they commit, known to be stored."""
    catalog: dict[NodeKey, CatalogEntry] = field(default_factory=dict)
    replica_events: list[ReplicaEvent] = field(default_factory=list)
    fleet_changes: list[Event] = field(default_factory=list)
    plan_results: list[WarmProgressed | WarmFinished] = field(default_factory=list)
    ignored: int = 0

    @property
    def has_records(self) -> bool:
        """Whether the batch holds more than counters: rows written beside the batch's counts."""
        return bool(self.replica_events or self.fleet_changes or self.plan_results)

    def edges(self) -> dict[NodeKey, ChainEdge]:
        """Every prefix the paths add, with its edge (for readers; the store writes the paths)."""
        return {
            (scope, prefix): edge
            for (scope, _leaf), path in self.paths.items()
            for prefix, edge in path.edges()
        }

    def scopes(self) -> set[Scope]:
        found = {key[0] for key in self.paths}
        found.update(key[0] for key in self.request_counts)
        found.update(key[0] for key in self.miss_counts)
        found.update(key[0] for key in self.catalog)
        return found


def fold_events(
    events: Iterable[Event], *, bucket_seconds: int, stored_nodes: Container[NodeKey]
) -> IngestBatch:
    """Fold `events` into one batch of deltas.

    `bucket_seconds` is the width of a statistics bucket; `stored_nodes` holds chain nodes already known
    to be in the database, whose edges need not be written again (a cache; being wrong costs a no-op
    write, never a wrong count). Events the planner does not ingest (plans) are counted in `ignored`.
    """
    batch = IngestBatch()
    for event in events:
        # The common case by class identity first: an isinstance check on a union costs more.
        if type(event) is RequestObserved:
            _fold_request(batch, event, bucket_seconds, stored_nodes)
        elif isinstance(event, PrefixMissed):
            _fold_miss(batch, event, bucket_seconds)
        elif isinstance(event, ReplicaEvent):
            batch.replica_events.append(event)
        elif isinstance(event, FLEET_TYPES):
            batch.fleet_changes.append(event)
        elif isinstance(event, WarmProgressed | WarmFinished):
            batch.plan_results.append(event)
        else:
            batch.ignored += 1
    return batch


def _fold_request(
    batch: IngestBatch, event: RequestObserved, bucket_seconds: int, stored: Container[NodeKey]
) -> None:
    scope = (event.tenant, event.model.name, event.prompt_rev)
    chain = event.chain
    key = (scope, chain[-1], int(event.occurred_at.timestamp()) // bucket_seconds)
    counts = batch.request_counts.get(key)
    if counts is None:
        counts = batch.request_counts[key] = RequestCounts()
    counts.requests += 1
    counts.prompt_tokens += event.prompt_tokens
    counts.cached_tokens += event.cached_tokens
    if event.cached_tokens == 0:
        counts.cold_requests += 1
    if event.ttft_ms is not None:
        counts.ttft_ms_sum += event.ttft_ms
        counts.ttft_count += 1
    # Walk from the leaf up: once a node is known to be stored (or added here), so are its ancestors.
    new_nodes = batch.new_nodes
    tokens = event.chain_tokens
    known = len(chain) - 1
    while known >= 0 and (node := (scope, chain[known])) not in stored and node not in new_nodes:
        known -= 1
    if known < len(chain) - 1:
        fresh = chain[known + 1 :]
        batch.paths[(scope, chain[-1])] = ChainPath(
            chain[known] if known >= 0 else None, known + 1, fresh, tokens[known + 1 :], event.occurred_at
        )
        new_nodes.update((scope, prefix) for prefix in fresh)
    payload = event.payload
    if payload is not None:
        # The contract guarantees the payload's prefix is on the chain.
        at = chain.index(payload.prefix_id)
        batch.catalog[(scope, payload.prefix_id)] = CatalogEntry(payload, tokens[at], event.occurred_at)


def _fold_miss(batch: IngestBatch, event: PrefixMissed, bucket_seconds: int) -> None:
    scope = (event.tenant, event.model.name, event.prompt_rev)
    depth = min(event.resident_depth, len(event.chain) - 1)
    key = (scope, event.chain[depth], int(event.occurred_at.timestamp()) // bucket_seconds)
    counts = batch.miss_counts.get(key)
    if counts is None:
        counts = batch.miss_counts[key] = MissCounts()
    counts.misses += 1
    counts.missed_tokens += max(0, event.chain_tokens[-1] - event.cached_tokens)
