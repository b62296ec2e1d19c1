"""One replica's residency: its engine's KV event feed, which verified prefixes it still holds, the probes
that settle doubt, and the `replica.residency` reports (issue 4, item 5).

The driver calls `step` on its loop; the watch assesses at most every `residency_interval_s` (at once
after `learn`), tells the driver which keys were lost (so a later plan warms them again), and reports
when what it would say changed. A reconciliation probes, one at a time at warm priority and only while
no plan runs: every unsure key while the index is incomplete, and every `reconcile_interval_s` a sample
of the keys the index holds; a sampled key that misses means events were lost, so the index is marked
incomplete and every key it cannot find is probed next. A probe is the warm request: one that misses
re-fills the prefix, so an incomplete index costs re-warming what was evicted meanwhile, never a prefix
reported held that is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from itertools import groupby

from warmplane.services.warmer.core.replica import HeldKey
from warmplane.services.warmer.core.residency import GRACE_S, Assessment, Residency
from warmplane.services.warmer.kv_events import KvEventFeed
from warmplane.services.warmer.plan_run import RunReport
from warmplane.services.warmer.settings import EngineSettings, WarmSettings
from warmplane.services.warmer.vllm_client import EngineClient, WarmFailed
from warmplane.shared.cache_salt import SaltBook
from warmplane.shared.events import HeldPrefixes, PrefixPayload

log = logging.getLogger(__name__)
_FEED_RETRY_S = 5.0
_PROBE_BACKOFF_S = 10.0
"""After a failed probe, reconciliation waits this long before probing again."""
Report = Callable[[list[HeldPrefixes], int, bool], None]
"""Publishes a residency report: (held, lost, complete)."""


class ResidencyWatch:
    def __init__(
        self,
        *,
        engine: EngineSettings,
        warm: WarmSettings,
        client: EngineClient,
        salts: SaltBook,
        report: Report,
        wake: Callable[[], None],
    ) -> None:
        assert engine.kv_events_endpoint is not None
        self.feed = KvEventFeed(
            engine.kv_events_endpoint,
            replay_endpoint=engine.kv_events_replay_endpoint,
            topic=engine.kv_events_topic,
            replay_timeout_s=warm.replay_timeout_s,
            changed=self._changed,
        )
        self._warm = warm
        self._client = client
        self._salts = salts
        self._report = report
        self._wake = wake
        self.residency = Residency()
        self.lost = 0
        """Prefixes warmed in this incarnation and lost since (evicted, or the cache cleared)."""
        self.last: Assessment | None = None
        self._clears = 0
        self._dirty = False
        self._due = True
        self._last_assessed = float("-inf")
        self._recheck_at = float("inf")
        self._last_reconciled = time.monotonic()
        self._reported: tuple[frozenset[HeldKey], int, bool] | None = None
        self._probing: asyncio.Task[None] | None = None
        self._probe_after = float("-inf")

    async def run(self) -> None:
        """The feed, until cancelled, started again 5 s after a failure (meanwhile the index is doubted:
        what it cannot find is probed); a reconciliation in flight is cancelled with it."""
        try:
            while True:
                try:
                    await self.feed.run()
                except Exception:
                    log.exception(
                        "KV events from %s: the subscription failed; again in 5 s", self.feed.endpoint
                    )
                    self.feed.index.doubt()
                    self._changed()
                    await asyncio.sleep(_FEED_RETRY_S)
        finally:
            if self._probing is not None:
                self._probing.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._probing

    def restart(self) -> None:
        """A new incarnation: the engine's cache, its events and every answer start over."""
        self.feed.reset()
        self.residency = Residency()
        self.lost, self._clears, self._reported, self.last = 0, 0, None, None
        self._due = True

    def learn(self, report: RunReport, payloads: dict[HeldKey, PrefixPayload]) -> None:
        """A run verified `report.chains`: follow them, and report at the next step."""
        now = time.monotonic()
        self.residency.learn(report.chains, payloads, now, self._seq())
        self._due = True
        self._recheck_at = now + GRACE_S  # what the grace kept held is judged then

    def step(self, held: set[HeldKey], *, idle: bool, forget: Callable[[frozenset[HeldKey]], None]) -> None:
        """Assess `held` if due; `forget` the keys lost; report a change; start a reconciliation if due
        and `idle` (the engine answers and no plan runs); after a failed probe, not for 10 s."""
        now = time.monotonic()
        index = self.feed.index
        if index.clears != self._clears:
            self._clears = index.clears
            self.residency.cleared()
        interval_passed = now - self._last_assessed >= self._warm.residency_interval_s
        if self._due or now >= self._recheck_at or (self._dirty and interval_passed):
            self._assess(held, forget)
        if idle and self._probing is None and self.last is not None:
            keys = self._to_probe(now)
            if keys:
                self._probing = asyncio.create_task(self._probe(keys), name="reconcile residency")
                self._probing.add_done_callback(lambda _: self._probe_done())

    def _assess(self, held: set[HeldKey], forget: Callable[[frozenset[HeldKey]], None]) -> None:
        self._due = self._dirty = False
        self._last_assessed = time.monotonic()
        if self._last_assessed >= self._recheck_at:
            self._recheck_at = float("inf")
        found = self.residency.assess(held, self.feed.index, self._last_assessed)
        self.last = found
        if found.lost:
            log.info("%d warmed prefixes no longer held (KV events)", len(found.lost))
            self.lost += len(found.lost)
            self.residency.forget(found.lost)
            forget(found.lost)
        said = (found.held, self.lost, found.complete)
        if said != self._reported:
            self._reported = said
            self._report(groups(found.held), self.lost, found.complete)

    def _to_probe(self, now: float) -> list[HeldKey]:
        assert self.last is not None
        if now < self._probe_after:
            return []  # a probe failed: the engine gets a rest before the next
        unsure = [key for key in sorted(self.last.unsettled) if key in self.residency.payloads]
        if unsure:
            return unsure
        if now - self._last_reconciled < self._warm.reconcile_interval_s:
            return []
        self._last_reconciled = now
        return [
            key
            for key in self.residency.sample(self.last.held, self._warm.reconcile_sample)
            if key in self.residency.payloads
        ]

    async def _probe(self, keys: list[HeldKey]) -> None:
        index = self.feed.index
        for key in keys:
            tenant, model, _, epoch, _ = key
            salt = self._salts.salt(tenant, model, epoch)
            payload = self.residency.payloads.get(key)
            if salt is None or payload is None:
                continue
            chain = self.residency.chains.get(key)
            believed = index.complete and chain is not None and index.holds(chain)
            try:
                answer = await self._client.warm(payload, cache_salt=salt, priority=self._warm.priority)
            except WarmFailed as failure:
                log.info("reconciliation: probe of prefix %d failed: %s", key[4], failure.reason)
                self._probe_after = time.monotonic() + _PROBE_BACKOFF_S
                return
            hit = answer.cached_tokens >= self._client.expected_cached_tokens(answer.prompt_tokens)
            if believed and not hit:
                log.warning("reconciliation: a prefix the KV events hold missed; events were lost")
                index.doubt()
            self.residency.confirm(key, time.monotonic(), self._seq())

    def _seq(self) -> int:
        """The last batch the index applied (-1 before the first)."""
        last = self.feed.index.last_seq
        return -1 if last is None else last

    def _probe_done(self) -> None:
        self._probing = None
        self._due = True
        self._wake()

    def _changed(self) -> None:
        if not self._dirty:  # once per assessment: an engine publishes a batch per step
            self._dirty = True
            self._wake()


def groups(held: Iterable[HeldKey]) -> list[HeldPrefixes]:
    """`held` keys as the report carries them: prefix ids per (tenant, prompt revision, epoch)."""
    ordered = sorted(held, key=lambda key: (key[0], key[2], key[3], key[4]))
    return [
        HeldPrefixes(tenant, prompt_rev, epoch, [key[4] for key in keys])
        for (tenant, prompt_rev, epoch), keys in groupby(ordered, key=lambda key: (key[0], key[2], key[3]))
    ]
