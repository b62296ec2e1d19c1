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
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

import msgspec

from warmplane.services.planner.core.absorbed_counts import absorb
from warmplane.services.planner.core.ingest_batch import IngestBatch
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
_STATISTICS_KEPT = 16
"""(model, tenant) statistics kept for `statistics_max_age_s`, most recently used."""
_ABSORB_MAX_REQUESTS = 200_000
"""Requests of committed batches held for kept reads to absorb; past it the oldest go, and a kept read that
had not absorbed them reads again (a fresh read then costs less than absorbing them)."""
Partition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """What a model's plans are chosen from: each prefix of each scope (scope id, prefix), request counts per
    (scope id, leaf, bucket), and the prefixes the catalogue can render."""

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

    async def statistics(self, model: str, since_bucket: int) -> ModelStatistics: ...
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
        self._monotonic = monotonic
        """When a read began, in the clock of `StartsToPlan.committed_at` (seconds)."""
        self._kept: OrderedDict[tuple[str, str | None], _Statistics] = OrderedDict()
        self._fitted: OrderedDict[tuple[str, str | None], tuple[datetime, ReuseCalibration]] = OrderedDict()
        """(model, tenant) → when its calibration was fitted, and the fit (`calibration_max_age_s`)."""
        self._alone_since: float | None = None
        """Since when (monotonic) this planner counts every request (`counting_alone`); None: not."""
        self._committed: deque[_Committed] = deque()
        """Batches committed since the oldest kept read still absorbing, or a read under way, began."""
        self._committed_requests = 0
        self._seq = 0
        """The sequence number of the last batch put in `_committed`."""
        self._absorbed: dict[tuple[str, str | None], int] = {}
        """Each kept read that absorbs (`_statistics`): the last batch it holds."""
        self._reading: list[int] = []
        """The last batch committed when each read under way began."""
        self._choosing = asyncio.Lock()
        """One choice at a time: a kept trie absorbs batches in a worker thread while another would use it."""

    def counting_alone(self, alone: bool) -> None:
        """Whether this planner now counts every request of the traffic topics (its consumer owns all their
        partitions): only then do its own committed batches hold everything a later read would add, and
        its kept reads absorb them (`counts_committed`) instead of reading again."""
        if not alone:
            self._alone_since = None
            self._absorbed.clear()
            self._forget_committed()
        elif self._alone_since is None:
            self._alone_since = self._monotonic()

    def counts_committed(self, batch: IngestBatch, positions: Mapping[Partition, int]) -> None:
        """`batch` committed, its partitions counted up to `positions` (next offsets): a kept read absorbs
        it when it is next used. Held only while some kept read absorbs or a read is under way."""
        if self._alone_since is None or not batch.requests.leaves or not (self._absorbed or self._reading):
            return
        self._seq += 1
        self._committed.append(_Committed(self._seq, batch, dict(positions)))
        self._committed_requests += len(batch.requests.leaves)
        while self._committed_requests > _ABSORB_MAX_REQUESTS:
            self._committed_requests -= len(self._committed.popleft().batch.requests.leaves)

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
    ) -> _Statistics:
        """The trie of `model`'s counts (of `tenant`'s scopes, if given) and what goes with it, read now,
        or with `read_after` one begun after it and at most `statistics_max_age_s` ago: replicas planned
        one after another share one read (building a trie of 50,000 prefixes takes about 0.7 s). A kept
        trie is decayed to `now` when asked; only counts younger than it are not in it, and those are
        younger than `read_after`. Every read is kept for the next. The trie is built in a worker
        thread: ingestion, on the event loop, goes on meanwhile.

        While this planner counts every request (`counting_alone`), a kept read absorbs the batches it
        committed since (`core.absorbed_counts`) and serves every start for `statistics_live_s`: it then
        holds what a read now would, without the read and the build."""
        key = (model, tenant)
        for aged in [
            k for k, read in self._kept.items() if not read.read_at <= now < read.read_at + self._age(k)
        ]:
            self._drop(aged)  # a trie of a large model is big: none is held past its use
        kept = self._kept.get(key)
        if read_after is not None and kept is not None:
            if key in self._absorbed and await self._absorb(key, kept, now):
                self._kept.move_to_end(key)
                self._count("absorbed")
                return kept
            if kept.begun > read_after:
                self._kept.move_to_end(key)
                self._count("shared")
                return kept
        begun = self._monotonic()
        begun_after = self._seq
        horizon = weight_horizon_s(self._settings.half_life_s, self._settings.frequency_half_life_s)
        since = now - min(timedelta(hours=self._settings.window_hours), timedelta(seconds=horizon))
        self._reading.append(begun_after)
        try:
            stats = await self._store.statistics(model, int(since.timestamp()) // self._bucket_seconds)
        finally:
            self._reading.remove(begun_after)
        names = await self._store.scope_names(sorted({scope for scope, _ in stats.prefixes}))
        scope_of = _scopes_by_prefix(stats, names, tenant)
        fitted = self._fitted_within(key, now)
        trie, calibration = await asyncio.to_thread(self._build, stats, scope_of, now, model, fitted)
        if fitted is None and self._settings.calibration_max_age_s:
            self._fitted[key] = (now, calibration)
            if len(self._fitted) > _STATISTICS_KEPT:
                self._fitted.popitem(last=False)
        renderable = {prefix for prefix, scope in scope_of.items() if (scope, prefix) in stats.catalogued}
        read = _Statistics(now, begun, trie, scope_of, names, renderable, calibration)
        through = self._held_by(begun, begun_after, stats.positions)
        if through is not None or self._settings.statistics_max_age_s:
            self._drop(key)
            self._kept[key] = read
            if through is not None:
                self._absorbed[key] = through
            if len(self._kept) > _STATISTICS_KEPT:
                self._drop(next(iter(self._kept)))
        self._forget_committed()
        self._count("read")
        return read

    def _count(self, how: str) -> None:
        if self._metrics is not None:
            self._metrics.statistics_reads.labels(how).inc()

    def _age(self, key: tuple[str, str | None]) -> timedelta:
        """How long `key`'s kept read serves: `statistics_live_s` while it absorbs, else
        `statistics_max_age_s`."""
        live = key in self._absorbed
        return timedelta(
            seconds=self._settings.statistics_live_s if live else self._settings.statistics_max_age_s
        )

    def _drop(self, key: tuple[str, str | None]) -> None:
        self._kept.pop(key, None)
        self._absorbed.pop(key, None)

    def _held_by(
        self, begun: float, begun_after: int, positions: Mapping[Partition, int] | None
    ) -> int | None:
        """The last committed batch a read begun at `begun` holds, when it may absorb the later ones: this
        planner counted alone since before it, and the read's snapshot says where its partitions stood.
        Batches committed before it began are in it; of those committed while it ran, the ones its
        snapshot's positions cover (the writer commits one batch after another)."""
        if positions is None or not self._settings.statistics_live_s:
            return None
        if self._alone_since is None or self._alone_since > begun:
            return None
        through = begun_after
        for committed in self._committed:
            if committed.seq <= begun_after:
                continue
            if committed.seq != through + 1:
                return None  # some were let go (`_ABSORB_MAX_REQUESTS`): which is unknown
            if any(positions.get(p, 0) < offset for p, offset in committed.positions.items()):
                break
            through = committed.seq
        return through

    async def _absorb(self, key: tuple[str, str | None], kept: _Statistics, now: datetime) -> bool:
        """Bring `kept` up to date with the batches committed since it last absorbed (`core.absorbed_counts`);
        False, and it absorbs no more, when that cannot be done (a read is needed)."""
        through = self._absorbed[key]
        pending = [committed for committed in self._committed if committed.seq > through]
        if not self._alone_before(kept) or (pending[0].seq if pending else self._seq + 1) != through + 1:
            del self._absorbed[key]
            return False
        if pending:
            model, tenant = key
            absorbed = await asyncio.to_thread(
                absorb,
                kept.trie,
                kept.scope_of,
                kept.renderable,
                [committed.batch for committed in pending],
                scope_ids={(t, model, rev): scope for scope, (t, rev) in kept.names.items()},
                model=model,
                tenant=tenant,
                bucket_seconds=self._bucket_seconds,
                now=now.timestamp(),
            )
            if not absorbed or not self._alone_before(kept):  # a rebalance while it absorbed: read
                self._absorbed.pop(key, None)
                self._forget_committed()
                return False
            self._absorbed[key] = pending[-1].seq
            self._forget_committed()
        return True

    def _alone_before(self, kept: _Statistics) -> bool:
        """Whether this planner has counted alone since before `kept` was read."""
        return self._alone_since is not None and self._alone_since <= kept.begun

    def _forget_committed(self) -> None:
        """Let go of the committed batches every absorbing kept read and every read under way holds."""
        floor = min([*self._absorbed.values(), *self._reading], default=self._seq)
        while self._committed and self._committed[0].seq <= floor:
            self._committed_requests -= len(self._committed.popleft().batch.requests.leaves)

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
class _Statistics:
    """A model's statistics as read at `read_at`: its trie and the scopes and renderable prefixes."""

    read_at: datetime
    begun: float
    """When the read began (`WarmSetChooser._monotonic`): counts committed before it are in it."""
    trie: PrefixTrie
    scope_of: dict[int, int]
    names: dict[int, tuple[str, str]]
    renderable: set[int]
    calibration: ReuseCalibration
    """Score to observed reuse on these counts (`policy.fit_calibration`), or the prior."""


@dataclass(frozen=True, slots=True)
class _Committed:
    """A batch this planner committed (`WarmSetChooser.counts_committed`), numbered in commit order, and
    its partitions' next offsets after it."""

    seq: int
    batch: IngestBatch
    positions: dict[Partition, int]


@dataclass(frozen=True, slots=True)
class _ModelView:
    """One model's state for one round of choices: its statistics (read now or kept), its tenants' epochs
    and its live replicas (always read now)."""

    stats: _Statistics
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
