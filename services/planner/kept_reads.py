"""The reads of a model's counts the planner keeps between plans (`plan_choice.WarmSetChooser`), and how a
kept one stays current.

**Shared.** Replicas starting one after another share a read begun after their starts' batches committed
(`StartsToPlan.committed_at`), for `statistics_max_age_s`: counts younger than the read are younger than
the start.

**Absorbing.** While this planner's consumer owns every partition of the requests topic (`counting_alone`,
told on each assignment), the batches it commits hold all a later read would add. The writer hands each
committed batch and its partitions' next offsets here (`counts_committed`), and a kept read absorbs them
(`core.absorbed_counts`) while the planning task is free (`absorb_waiting`) and before it serves a plan,
for `statistics_live_s`: it then holds what a read now would, without the read and the trie build, so
re-plans (a bump, an alarm, a fleet change) take it too. A read says, in the same snapshot, where the
group's offsets stood (`ModelStatistics.positions`): batches committed before it began are in it, and of
those committed while it ran, the ones its offsets cover (the writer commits one batch after another), so
each is absorbed once or not at all. A scope the read did not see, a chain it lacks, a rebalance, or more
than `ABSORB_MAX_KEYS` counts waiting mean a read, as with several planners counting. So does a kept read
grown past `max_nodes` by absorbing (a read takes the most recent leaves within it), and the least recently
used kept reads go while together they hold more than that: what is kept is bounded by the setting.

**Refreshed ahead.** An absorbing read serves for `statistics_live_s`, then goes (a fresh read drops what
fell past the weight horizon). So that the plan after that does not pay the read, one in the last quarter of
its life is read again (`refresh_due`, at `absorb_waiting`'s turn). So is a read begun before this planner
counted alone (a planner that just started reads for its first start before its requests consumer is
assigned): read now, it would absorb. The chooser makes these reads off the planning task, and a plan
meanwhile takes the read being replaced (`WarmSetChooser.absorb_committed`).

One kept read serves at a time (`WarmSetChooser` chooses under a lock): absorbing changes its trie in a
worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from warmplane.services.planner.core.absorbed_counts import CommittedCounts, absorb
from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.policy import PrefixTrie, ReuseCalibration
from warmplane.services.planner.settings import PlanSettings

Key = tuple[str, str | None]
"""(model, tenant): a read of a model's counts, of one tenant's scopes if given (a bump)."""
Partition = tuple[str, int]
KEPT_READS = 16
"""Reads kept at most, the least recently used let go first."""
REFRESH_AFTER = 0.75
"""Of `statistics_live_s`: an absorbing read this old is read again while planning is free (module doc)."""
ABSORB_MAX_KEYS = 500_000
"""Counts of committed batches held for kept reads to absorb, in (scope, leaf, bucket) keys; past it the
oldest go, and a kept read that had not absorbed them reads again (a fresh read then costs less than
absorbing them)."""


@dataclass(frozen=True, slots=True)
class KeptRead:
    """A model's statistics as read at `read_at`: its trie and the scopes and renderable prefixes."""

    read_at: datetime
    begun: float
    """When the read began (monotonic): counts committed before it are in it."""
    trie: PrefixTrie
    scope_of: dict[int, int]
    names: dict[int, tuple[str, str]]
    renderable: set[int]
    calibration: ReuseCalibration
    """Score to observed reuse on these counts (`policy.fit_calibration`), or the prior."""


@dataclass(frozen=True, slots=True)
class ReadTicket:
    """A read under way: when it began, and the last batch committed then (`KeptReads.reading`)."""

    begun: float
    after: int


@dataclass(frozen=True, slots=True)
class _Committed:
    """A batch this planner committed, numbered in commit order, and its partitions' next offsets."""

    seq: int
    counts: CommittedCounts
    positions: dict[Partition, int]


class KeptReads:
    """The kept reads of one chooser and the batches committed since (module doc)."""

    def __init__(
        self,
        settings: PlanSettings,
        *,
        bucket_seconds: int,
        monotonic: Callable[[], float],
        metrics: PlannerMetrics | None = None,
    ) -> None:
        self._settings = settings
        self._bucket_seconds = bucket_seconds
        self._monotonic = monotonic
        """When a read began, in the clock of `StartsToPlan.committed_at` (seconds)."""
        self._metrics = metrics
        self._kept: OrderedDict[Key, KeptRead] = OrderedDict()
        self._absorbed: dict[Key, int] = {}
        """Each kept read that absorbs: the last batch it holds."""
        self._alone_since: float | None = None
        """Since when this planner counts every request (`counting_alone`); None: not."""
        self._committed: deque[_Committed] = deque()
        """Batches committed since the oldest kept read still absorbing, or a read under way, began."""
        self._committed_keys = 0
        self._seq = 0
        """The number of the last batch put in `_committed`."""
        self._reading: list[int] = []
        """The last batch committed when each read under way began."""

    def counting_alone(self, alone: bool) -> None:
        """Whether this planner now counts every request of the traffic topics (its consumer owns all their
        partitions): only then do its committed batches hold everything a later read would add."""
        if not alone:
            self._alone_since = None
            self._absorbed.clear()
            self._forget_committed()
        elif self._alone_since is None:
            self._alone_since = self._monotonic()

    def counts_committed(self, batch: IngestBatch, positions: Mapping[Partition, int]) -> bool:
        """`batch` committed, its partitions counted up to `positions` (next offsets): a kept read absorbs
        it when it is next used, or at `absorb_waiting`. Held only while some kept read absorbs or a read is
        under way. True when the kept reads have work for the planning task: absorbing it, or a read begun
        before this planner counted alone to make again (`refresh_due`)."""
        if self._alone_since is None or not batch.requests.leaves:
            return False
        if not (self._absorbed or self._reading):
            return bool(self._read_before_alone())
        self._seq += 1
        counts = CommittedCounts.of(batch, self._bucket_seconds)
        self._committed.append(_Committed(self._seq, counts, dict(positions)))
        self._committed_keys += len(counts.requests)
        while self._committed_keys > ABSORB_MAX_KEYS:
            self._committed_keys -= len(self._committed.popleft().counts.requests)
        return True

    async def absorb_waiting(self, now: datetime) -> None:
        """Every absorbing kept read absorbs the batches committed since it last did (at `now`), so a plan
        that comes next finds little left to absorb. One that cannot reads at its next plan."""
        for key in list(self._absorbed):
            kept = self._kept.get(key)
            if kept is not None and key in self._absorbed:
                await self._absorb(key, kept, now)

    def refresh_due(self, now: datetime) -> list[Key]:
        """The kept reads to read again before a plan has to (module doc): the absorbing ones past
        `REFRESH_AFTER` of their `statistics_live_s` at `now`, then those begun before this planner counted
        alone. A read made again begins after it, and is not due again until it ages."""
        since = now - timedelta(seconds=self._settings.statistics_live_s * REFRESH_AFTER)
        aging = [key for key, read in self._kept.items() if key in self._absorbed and read.read_at <= since]
        return aging + self._read_before_alone()

    def _read_before_alone(self) -> list[Key]:
        """The kept reads that do not absorb because they began before this planner counted alone."""
        alone = self._alone_since
        if alone is None or not self._settings.statistics_live_s:
            return []
        return [key for key, read in self._kept.items() if key not in self._absorbed and read.begun < alone]

    def peek(self, key: Key) -> KeptRead | None:
        """`key`'s kept read as it stands, whatever its age (for inspection)."""
        return self._kept.get(key)

    async def serving(self, key: Key, now: datetime, read_after: float | None) -> KeptRead | None:
        """`key`'s kept read if it may serve a plan at `now`: absorbing, brought up to date (it then holds
        what a read would: any plan may take it, a re-plan too); or, with `read_after` (starts whose batches
        committed then), begun after it. None: read. Reads past their age go."""
        for aged in [
            k for k, read in self._kept.items() if not read.read_at <= now < read.read_at + self._age(k)
        ]:
            self._drop(aged)  # a trie of a large model is big: none is held past its use
        kept = self._kept.get(key)
        if kept is None:
            return None
        if key in self._absorbed and await self._absorb(key, kept, now):
            how = "absorbed"
        elif read_after is not None and kept.begun > read_after:
            how = "shared"
        else:
            return None
        self._kept.move_to_end(key)
        self._count(how)
        return kept

    @contextlib.contextmanager
    def reading(self) -> Iterator[ReadTicket]:
        """Around a read of the counts, up to its `keep`: the batches committed meanwhile are held, and
        `keep` says which of them the read holds."""
        ticket = ReadTicket(self._monotonic(), self._seq)
        self._reading.append(ticket.after)
        try:
            yield ticket
        finally:
            self._reading.remove(ticket.after)
            self._forget_committed()

    def keep(
        self,
        key: Key,
        read: KeptRead,
        ticket: ReadTicket,
        positions: Mapping[Partition, int] | None,
        *,
        how: str = "read",
    ) -> None:
        """Keep `read` (begun with `ticket`; its snapshot's `positions`) for the plans after it: absorbing
        when it may, else shared for `statistics_max_age_s` (if any). `how` labels it in the metric: "read"
        for a plan, "refreshed" ahead of one."""
        self._count(how)
        through = self._held_by(ticket, positions)
        if through is not None or self._settings.statistics_max_age_s:
            self._drop(key)
            self._kept[key] = read
            if through is not None:
                self._absorbed[key] = through
            while len(self._kept) > KEPT_READS or (len(self._kept) > 1 and self._nodes_over()):
                self._drop(next(iter(self._kept)))
        self._forget_committed()

    def _nodes_over(self) -> bool:
        """Whether the kept reads hold more chain nodes together than `max_nodes`."""
        bound = self._settings.max_nodes
        return bound is not None and sum(len(read.trie) for read in self._kept.values()) > bound

    def _held_by(self, ticket: ReadTicket, positions: Mapping[Partition, int] | None) -> int | None:
        """The last committed batch a read holds, when it may absorb the later ones: this planner counted
        alone since before it began, and its snapshot says where the partitions stood (module doc)."""
        if positions is None or not self._settings.statistics_live_s:
            return None
        if self._alone_since is None or self._alone_since > ticket.begun:
            return None
        through = ticket.after
        for committed in self._committed:
            if committed.seq <= ticket.after:
                continue
            if committed.seq != through + 1:
                return None  # some were let go (`ABSORB_MAX_KEYS`): which is unknown
            if any(positions.get(p, 0) < offset for p, offset in committed.positions.items()):
                break
            through = committed.seq
        return through

    async def _absorb(self, key: Key, kept: KeptRead, now: datetime) -> bool:
        """Bring `kept` up to date with the batches committed since it last absorbed; False, and it absorbs
        no more, when that cannot be done (a read is needed)."""
        through = self._absorbed[key]
        pending = [committed for committed in self._committed if committed.seq > through]
        if not self._alone_before(kept) or (pending[0].seq if pending else self._seq + 1) != through + 1:
            del self._absorbed[key]
            return False
        if not pending:
            return True
        model, tenant = key
        absorbed = await asyncio.to_thread(
            absorb,
            kept.trie,
            kept.scope_of,
            kept.renderable,
            [committed.counts for committed in pending],
            scope_ids={(t, model, rev): scope for scope, (t, rev) in kept.names.items()},
            model=model,
            tenant=tenant,
            bucket_seconds=self._bucket_seconds,
            now=now.timestamp(),
        )
        if not (absorbed and self._alone_before(kept)):  # else a rebalance came while it absorbed: read
            self._absorbed.pop(key, None)
            self._forget_committed()
            return False
        self._absorbed[key] = pending[-1].seq
        bound = self._settings.max_nodes
        if bound is not None and len(kept.trie) > bound:
            del self._absorbed[key]  # it serves this plan; the next reads, within the bound
        self._forget_committed()
        return True

    def _alone_before(self, kept: KeptRead) -> bool:
        """Whether this planner has counted alone since before `kept` was read."""
        return self._alone_since is not None and self._alone_since <= kept.begun

    def _age(self, key: Key) -> timedelta:
        """How long `key`'s kept read serves: `statistics_live_s` while it absorbs, else
        `statistics_max_age_s`."""
        live = key in self._absorbed
        return timedelta(
            seconds=self._settings.statistics_live_s if live else self._settings.statistics_max_age_s
        )

    def _drop(self, key: Key) -> None:
        self._kept.pop(key, None)
        self._absorbed.pop(key, None)

    def _forget_committed(self) -> None:
        """Let go of the committed batches every absorbing kept read and every read under way holds."""
        floor = min([*self._absorbed.values(), *self._reading], default=self._seq)
        while self._committed and self._committed[0].seq <= floor:
            self._committed_keys -= len(self._committed.popleft().counts.requests)

    def _count(self, how: str) -> None:
        if self._metrics is not None:
            self._metrics.statistics_reads.labels(how).inc()
