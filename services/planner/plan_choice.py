"""Choosing the items of warm plans: the statistics a plan is chosen from are read here, the decisions are
the pure policy's (`policy.trie_from_counts`, `policy.choose_for_replicas`).

For a model (and, for an epoch bump, one tenant of it), the trie is built once from the stored counts of the
last `window_hours` or the weight horizon (`policy.weight_horizon_s`: 12 of the longest half-life, past which
a count weighs under 2 ** -12), whichever is shorter, decayed to now with `half_life_s` and with
`frequency_half_life_s` (a rate is the mean of the two estimates), and the map from score to reuse is
fitted on the same counts (`policy.fit_calibration`: scored at now minus the ramp window, against what was
used since) and serves the reads of the next `calibration_max_age_s`; then, per replica, the selection keeps
the prefixes the gateway's ring sends to it among the model's live replicas (the replica included), whose
calibrated probability of reuse is at least `min_reuse_probability`, within the budget (settings, capped
by its KV capacity), minus what it already holds (`PgPlanStore.held_by`: its warmer's residency report on its
latest start and the plans verified after it, or without a report the items of its verified plans since
that start), in their tenant's current epoch. Only catalogued prefixes can be warmed (a
payload renders them and their chain). Items name their tenant, prompt revision and current epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

import msgspec

from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.kept_reads import KEPT_READS, KeptRead, KeptReads, Partition
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.policy import (
    EmptyReason,
    LeafCount,
    PolicyKnobs,
    PrefixTrie,
    ReuseCalibration,
    RingSpec,
    StoredPrefix,
    WarmBudget,
    WarmDecision,
    WarmThresholds,
    choose_for_replicas,
    decide_warm,
    fit_calibration,
    trie_from_counts,
    weight_horizon_s,
)
from warmplane.services.planner.policy.replica_plan import NodeKey
from warmplane.services.planner.settings import PlanRingSettings, PlanSettings
from warmplane.shared.events import LIVE_REPLICA_STATES, PrefixPayload, WarmItem

log = logging.getLogger(__name__)
"""The states of a replica that is or will be serving (`replicas.state`): the ring's members."""
_ENVELOPE_BYTES = 4_096
"""Room a plan's fields other than its items take, with margin (names are at most 128 characters)."""


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """What a model's plans are chosen from: request counts per (scope id, leaf, bucket), the prefixes on
    the counted leaves' chains (scope id, prefix), and which of those the catalogue can render."""

    prefixes: list[tuple[int, StoredPrefix]]
    counts: list[tuple[int, int, int, int]]
    catalogued: set[NodeKey]
    positions: dict[Partition, int] | None = None
    """The next offset of each partition the planner's group had counted, in the read's snapshot: which of
    its committed batches the counts include. None when the store cannot say: nothing is absorbed then."""


@dataclass(frozen=True, slots=True)
class LiveReplica:
    """A replica starting, loading, warming or ready (`state`), the weights `revision` it serves, and its KV
    capacity once its warmer reported one."""

    replica: str
    node: str
    revision: str
    state: str
    kv_capacity_tokens: int | None


@dataclass(frozen=True, slots=True)
class HeldItem:
    """A prefix a replica holds (reported by its warmer, or a verified plan's item since its latest start),
    in (tenant, epoch)."""

    prefix_id: int
    tenant: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Choice:
    """A plan's items, most valuable first (ancestors before descendants), and its token limit; when the
    policy judged warming not worth it (`policy.decide_warm`), no items, the reason and its one line."""

    items: list[WarmItem]
    budget_tokens: int
    empty_reason: EmptyReason | None = None
    empty_message: str | None = None


class ChoiceStore(Protocol):
    """What choosing needs of the database (`pg_plans.PgPlanStore` is the real one)."""

    async def statistics(
        self, model: str, since_bucket: int, max_nodes: int | None = None
    ) -> ModelStatistics: ...
    async def payloads(self, keys: Sequence[NodeKey]) -> dict[NodeKey, PrefixPayload]: ...
    async def scope_names(self, scope_ids: Sequence[int]) -> dict[int, tuple[str, str]]: ...
    async def current_epochs(self, model: str) -> dict[str, int]: ...
    async def live_replicas(self, model: str) -> list[LiveReplica]: ...
    async def held_by(self, replicas: Sequence[str]) -> dict[str, list[HeldItem]]: ...


class WarmSetChooser:
    """Chooses plans' items for the replicas of one model at a time."""

    def __init__(
        self,
        store: ChoiceStore,
        settings: PlanSettings,
        ring: PlanRingSettings,
        *,
        bucket_seconds: int,
        max_plan_bytes: int,
        clock: Callable[[], datetime],
        monotonic: Callable[[], float] = time.monotonic,
        metrics: PlannerMetrics | None = None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._settings = settings
        self._ring = RingSpec(ring.depth, ring.vnodes, ring.load_factor, spread=ring.mode == "spread")
        self._knobs = PolicyKnobs(
            settings.half_life_s,
            settings.frequency_half_life_s,
            settings.ramp_window_s,
            settings.min_reuse_probability,
            settings.capacity_fraction,
        )
        self._thresholds = WarmThresholds(
            settings.min_expected_saved_tokens,
            settings.deadline_s,
            settings.prefill_tokens_per_s,
            settings.min_reuse_probability,
        )
        self._budget = WarmBudget(
            settings.budget_tokens, settings.warm_seconds, settings.prefill_tokens_per_s
        )
        self._bucket_seconds = bucket_seconds
        self._max_item_bytes = max_plan_bytes - _ENVELOPE_BYTES
        self._clock = clock
        self._kept = KeptReads(settings, bucket_seconds=bucket_seconds, monotonic=monotonic, metrics=metrics)
        self._fitted: OrderedDict[tuple[str, str | None], tuple[datetime, ReuseCalibration]] = OrderedDict()
        """(model, tenant) → when its calibration was fitted, and the fit (`calibration_max_age_s`)."""
        self._choosing = asyncio.Lock()
        """One choice at a time: a kept trie absorbs batches in a worker thread while another would use it."""
        self._refreshing: asyncio.Task[None] | None = None
        """The reads being made again ahead of plans (`absorb_committed`), off the planning task."""

    def counting_alone(self, alone: bool) -> None:
        """Whether this planner counts every request of the traffic topics (`KeptReads.counting_alone`)."""
        self._kept.counting_alone(alone)

    def counts_committed(self, batch: IngestBatch, positions: Mapping[Partition, int]) -> bool:
        """`batch` committed with its partitions at `positions`; True if a kept read will absorb it
        (`KeptReads.counts_committed`)."""
        return self._kept.counts_committed(batch, positions)

    async def absorb_committed(self) -> None:
        """Kept reads absorb what was committed since they last did (`KeptReads.absorb_waiting`), between
        choices. Those due (`KeptReads.refresh_due`: near the end of their life, or begun before this
        planner counted alone) are read again in a task of their own, one after another: the planning task
        goes on, and a plan meanwhile takes the read being replaced, which is still current. Only the
        keeping of each new read waits for the choice under way."""
        async with self._choosing:
            now = self._clock()
            await self._kept.absorb_waiting(now)
            due = self._kept.refresh_due(now)
        if due and (self._refreshing is None or self._refreshing.done()):
            self._refreshing = asyncio.create_task(self._read_again(due), name="planner-refresh")

    async def refreshed(self) -> None:
        """Return once the reads being made again (`absorb_committed`), if any, are kept."""
        if self._refreshing is not None:
            await asyncio.shield(self._refreshing)

    async def close(self) -> None:
        """Stop the reads being made again: the next plans read for themselves."""
        task, self._refreshing = self._refreshing, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _read_again(self, keys: Sequence[tuple[str, str | None]]) -> None:
        for key in keys:
            try:
                await self._read_and_keep(key, self._clock(), keep_under=self._choosing)
            except Exception:  # the next plan of that model reads for itself
                log.exception("could not read the counts of %s again ahead of its plans", key)

    async def choose(
        self,
        model: str,
        tenant: str | None,
        epoch: int,
        replicas: Sequence[str],
        *,
        holding_nothing: Collection[str] = (),
        read_after: float | None = None,
    ) -> dict[str, Choice]:
        """Each of `replicas`' items for `model`: of `tenant`'s prefixes only if given, each at its tenant's
        current epoch (at least `epoch` for `tenant`), minus what each holds (nothing for those in
        `holding_nothing`: a requested re-warm). With `read_after` (monotonic seconds), a read of the counts
        begun after it and at most `statistics_max_age_s` ago will do (replicas starting one after another,
        whose batches had committed by `read_after`); without it they are read now (a re-plan is asked for
        because the knowledge changed). Raises what the store raises."""
        async with self._choosing:
            return await self._choose(
                model, tenant, epoch, replicas, holding_nothing=holding_nothing, read_after=read_after
            )

    async def _choose(
        self,
        model: str,
        tenant: str | None,
        epoch: int,
        replicas: Sequence[str],
        *,
        holding_nothing: Collection[str],
        read_after: float | None,
    ) -> dict[str, Choice]:
        now = self._clock()
        view = await self._read(model, tenant, epoch, now, read_after=read_after)
        asked = [replica for replica in replicas if replica not in holding_nothing]
        holdings = await self._store.held_by(asked) if asked else {}
        resident = {
            replica: {held.prefix_id for held in holding if held.epoch == view.epochs.get(held.tenant, 0)}
            for replica, holding in holdings.items()
        }
        selected = choose_for_replicas(
            view.stats.trie,
            now.timestamp(),
            capacities=_capacities(replicas, view.live),
            members=[r.replica for r in view.live],
            ring=self._ring,
            budget=self._budget,
            knobs=self._knobs,
            resident=resident,
            renderable=view.stats.renderable,
            max_items=self._settings.max_items,
            calibration=view.stats.calibration,
        )
        decisions = {
            replica: decide_warm(model, blocks, self._thresholds)
            if replica not in holding_nothing  # a requested re-warm warms whatever it is worth
            else WarmDecision(blocks, None, None)
            for replica, (blocks, _) in selected.items()
        }
        chosen = {
            replica: (
                [b.prefix_id for b in decisions[replica].items if b.prefix_id in view.stats.renderable],
                limit,
            )
            for replica, (_, limit) in selected.items()
        }
        payloads = await self._store.payloads(
            sorted({(view.stats.scope_of[p], p) for ids, _ in chosen.values() for p in ids})
        )
        return {
            replica: Choice(
                fit_items(view.items(ids, payloads), self._max_item_bytes),
                limit,
                decisions[replica].reason,
                decisions[replica].message,
            )
            for replica, (ids, limit) in chosen.items()
        }

    async def _read(
        self, model: str, tenant: str | None, epoch: int, now: datetime, *, read_after: float | None
    ) -> _ModelView:
        """What every replica's choice shares: the trie at `now`, scopes, epochs, live replicas."""
        known = await self._statistics(model, tenant, now, read_after=read_after)
        epochs = await self._store.current_epochs(model)
        if tenant is not None:
            epochs[tenant] = max(epochs.get(tenant, 0), epoch)
        live = [r for r in await self._store.live_replicas(model) if r.state in LIVE_REPLICA_STATES]
        return _ModelView(known, epochs, live)

    async def _statistics(
        self, model: str, tenant: str | None, now: datetime, *, read_after: float | None
    ) -> KeptRead:
        """The trie of `model`'s counts (of `tenant`'s scopes, if given) and what goes with it, read now,
        or with `read_after` one begun after it and at most `statistics_max_age_s` ago: replicas planned
        one after another share one read (building a trie of 50,000 prefixes takes about 0.7 s). A kept
        trie is decayed to `now` when asked; only counts younger than it are not in it, and those are
        younger than `read_after`; while this planner counts alone, a kept read absorbs its commits and
        serves for `statistics_live_s` (`kept_reads.py`). Every read is kept for the next."""
        key = (model, tenant)
        kept = await self._kept.serving(key, now, read_after)
        if kept is not None:
            return kept
        return await self._read_and_keep(key, now)

    async def _read_and_keep(
        self, key: tuple[str, str | None], now: datetime, *, keep_under: asyncio.Lock | None = None
    ) -> KeptRead:
        """`key`'s counts read now and kept for the next plans, under `keep_under` if given (a read made
        again, while another plan may be choosing). The trie is built in a worker thread: ingestion, on the
        event loop, goes on meanwhile."""
        model, tenant = key
        horizon = weight_horizon_s(self._settings.half_life_s, self._settings.frequency_half_life_s)
        since = now - min(timedelta(hours=self._settings.window_hours), timedelta(seconds=horizon))
        # Until the read is kept, batches committing meanwhile are held for it to absorb: those after its
        # snapshot are in neither the read nor, later, a read of its own.
        with self._kept.reading() as ticket:
            stats = await self._store.statistics(
                model, int(since.timestamp()) // self._bucket_seconds, self._settings.max_nodes
            )
            names = await self._store.scope_names(sorted({scope for scope, _ in stats.prefixes}))
            scope_of = _scopes_by_prefix(stats, names, tenant)
            fitted = self._fitted_within(key, now)
            trie, calibration = await asyncio.to_thread(self._build, stats, scope_of, now, model, fitted)
            if fitted is None and self._settings.calibration_max_age_s:
                self._fitted[key] = (now, calibration)
                if len(self._fitted) > KEPT_READS:
                    self._fitted.popitem(last=False)
            renderable = {p for p, scope in scope_of.items() if (scope, p) in stats.catalogued}
            read = KeptRead(now, ticket.begun, trie, scope_of, names, renderable, calibration)
            async with keep_under or contextlib.nullcontext():
                how = "read" if keep_under is None else "refreshed"
                self._kept.keep(key, read, ticket, stats.positions, how=how)
        return read

    def _fitted_within(self, key: tuple[str, str | None], now: datetime) -> ReuseCalibration | None:
        """`key`'s calibration if it was fitted at most `calibration_max_age_s` before `now`."""
        fitted = self._fitted.get(key)
        max_age = timedelta(seconds=self._settings.calibration_max_age_s)
        if fitted is None or not fitted[0] <= now < fitted[0] + max_age:
            return None
        self._fitted.move_to_end(key)
        return fitted[1]

    def _build(
        self,
        stats: ModelStatistics,
        scope_of: dict[int, int],
        now: datetime,
        model: str,
        calibration: ReuseCalibration | None,
    ) -> tuple[PrefixTrie, ReuseCalibration]:
        """The trie of `stats` at `now`, and its calibration: `calibration` if given, else fitted on `stats`
        (pure: run in a worker thread)."""
        half = self._bucket_seconds / 2
        prefixes = [prefix for scope, prefix in stats.prefixes if scope_of.get(prefix.prefix_id) == scope]
        counts = [
            LeafCount(leaf, bucket * self._bucket_seconds + half, requests)
            for scope, leaf, bucket, requests in stats.counts
            if scope_of.get(leaf) == scope
        ]
        trie, left_out = trie_from_counts(
            prefixes,
            counts,
            now.timestamp(),
            self._settings.half_life_s,
            self._settings.frequency_half_life_s,
        )
        if left_out:
            log.warning("%d leaves of %s left out of the trie (unknown chain or bad tokens)", left_out, model)
        if calibration is None:
            calibration = fit_calibration(prefixes, counts, now.timestamp(), self._knobs)
        return trie, calibration


@dataclass(frozen=True, slots=True)
class _ModelView:
    """One model's state for one round of choices: its statistics (read now or kept), its tenants' epochs
    and its live replicas (always read now)."""

    stats: KeptRead
    epochs: dict[str, int]
    live: list[LiveReplica]

    def items(self, prefixes: Sequence[int], payloads: dict[NodeKey, PrefixPayload]) -> list[WarmItem]:
        """The plan items of `prefixes`, in order; one whose payload is gone (swept) is left out."""
        items = []
        stats = self.stats
        for prefix in prefixes:
            scope = stats.scope_of[prefix]
            node = stats.trie.node(prefix)
            if (scope, prefix) in payloads and scope in stats.names and node is not None:
                tenant, prompt_rev = stats.names[scope]
                payload = payloads[(scope, prefix)]
                items.append(
                    WarmItem(prefix, node.tokens, payload, tenant, prompt_rev, self.epochs.get(tenant, 0))
                )
        return items


def _scopes_by_prefix(
    stats: ModelStatistics, names: dict[int, tuple[str, str]], tenant: str | None
) -> dict[int, int]:
    """The scope of each prefix id (of `tenant`'s scopes only, if given). Ids are chained hashes whose root
    hashes the scope, so one id in two scopes is a 64-bit collision: the first scope keeps it."""
    scope_of: dict[int, int] = {}
    for scope, prefix in stats.prefixes:
        if tenant is None or names.get(scope, ("",))[0] == tenant:
            scope_of.setdefault(prefix.prefix_id, scope)
    return scope_of


def _capacities(replicas: Sequence[str], live: Sequence[LiveReplica]) -> dict[str, int | None]:
    """Each replica's reported KV capacity; before it reports one (a replica is planned as it starts),
    the least its model's live peers reported (they run the same engine settings in practice); else
    None."""
    known = {r.replica: r.kv_capacity_tokens for r in live if r.kv_capacity_tokens is not None}
    fallback = min(known.values()) if known else None
    return {replica: known.get(replica, fallback) for replica in replicas}


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
