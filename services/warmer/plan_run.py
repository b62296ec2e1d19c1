"""Carrying out one warm plan on one engine: pre-fill every item, then probe that each one stuck.

Every item is sent once (`max_tokens=1`, low priority, at most `concurrency` in flight, shortest first so
a child reuses the blocks its parent just filled), then repeated as a probe (at most `probe_concurrency`
in flight: a probe recomputes one block, and the engine batches many) and called verified when the
engine's `cached_tokens` equals the item's full blocks. With `verify_each`, an item is probed as soon
as it is warm, while the others still warm: the probes hide behind prefill. Without it, probes wait
for the whole plan, which also catches a plan whose end evicted its beginning: the warmer verifies
each only when the plan fits well inside the engine's KV cache.

A verified item's blocks (`BlockChain`, from the token ids the engine rendered it to, under its salt) are
in the report, so the warmer can follow them in the engine's KV events.

Every item ends in one state with a reason: `verified`, `unverified` (the probe found fewer cached tokens),
`failed` (no salt for its tenant, a rejected payload, a timeout or transport error after `attempts` tries)
or `too_short` (under one block plus a token: nothing a cache could hold). A run that is cancelled keeps
what it finished: `report()` at any moment tells what is verified so far.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from warmplane.services.warmer.core.kv_index import BlockChain, block_chain
from warmplane.services.warmer.core.replica import HeldKey, Outcome, RunOrder, held_key
from warmplane.services.warmer.vllm_client import EngineClient, WarmFailed, WarmResult
from warmplane.shared.cache_salt import SaltBook
from warmplane.shared.events import WarmItem

ItemState = Literal["pending", "warmed", "verified", "unverified", "failed", "too_short"]


@dataclass(slots=True)
class ItemResult:
    item: WarmItem
    state: ItemState = "pending"
    reason: str = ""
    prompt_tokens: int = 0
    tokens_prefilled: int = 0
    chain: BlockChain | None = None


@dataclass(frozen=True, slots=True)
class RunReport:
    plan_id: uuid.UUID
    items_total: int
    items_done: int
    tokens_prefilled: int
    verified: frozenset[HeldKey]
    needed: int
    already_held: int
    failures: list[str]
    chains: dict[HeldKey, BlockChain]
    """The blocks of each verified item whose token ids the engine returned."""

    def outcome(self, stopped: str = "") -> Outcome:
        return Outcome(self.plan_id, self.verified, self.needed, self.already_held, stopped)


class PlanRun:
    """One run of a `RunOrder` against `client`; `progress(report)` is called as items finish."""

    def __init__(
        self,
        order: RunOrder,
        client: EngineClient,
        salts: SaltBook,
        *,
        priority: int,
        attempts: int,
        probe_concurrency: int | None = None,
        verify_each: bool = False,
        progress: Callable[[RunReport], None] = lambda report: None,
    ) -> None:
        self.order = order
        self._probe_limit = probe_concurrency or order.concurrency
        self._verify_each = verify_each
        self._client = client
        self._salts = salts
        self._priority = priority
        self._attempts = attempts
        self._progress = progress
        items = sorted(order.items, key=lambda item: item.tokens)
        self._results = [ItemResult(item) for item in items]
        self.warm_pass_s: float | None = None
        """Seconds until every item was warm (and, with `verify_each`, probed), once that is so."""

    async def run(self) -> RunReport:
        """Warm, then probe, every item; the final report. Cancellation propagates (see `report`)."""
        warm_limit = asyncio.Semaphore(self.order.concurrency)
        probe_limit = asyncio.Semaphore(self._probe_limit)
        began = time.perf_counter()
        async with asyncio.TaskGroup() as warms:
            for result in self._results:
                warms.create_task(self._warm_then_probe(warm_limit, probe_limit, result))
        self.warm_pass_s = time.perf_counter() - began
        async with asyncio.TaskGroup() as probes:
            for result in self._results:
                if result.state == "warmed":
                    probes.create_task(self._bounded(probe_limit, self._probe, result))
        return self.report()

    async def _warm_then_probe(
        self, warm_limit: asyncio.Semaphore, probe_limit: asyncio.Semaphore, result: ItemResult
    ) -> None:
        await self._bounded(warm_limit, self._warm, result)
        if self._verify_each and result.state == "warmed":
            await self._bounded(probe_limit, self._probe, result)

    def report(self) -> RunReport:
        """What the run has achieved so far (items still pending count as not done)."""
        plan = self.order.plan
        results = self._results
        return RunReport(
            plan_id=plan.plan_id,
            items_total=len(plan.items),
            items_done=sum(r.state not in ("pending", "warmed") for r in results) + self.order.already_held,
            tokens_prefilled=sum(r.tokens_prefilled for r in results),
            verified=frozenset(held_key(plan, r.item) for r in results if r.state == "verified"),
            needed=sum(r.state != "too_short" for r in results),
            already_held=self.order.already_held,
            failures=[
                f"prefix {r.item.prefix_id}: {r.reason}"
                for r in results
                if r.state in ("failed", "unverified")
            ],
            chains={
                held_key(plan, r.item): r.chain
                for r in results
                if r.state == "verified" and r.chain is not None
            },
        )

    async def _bounded(
        self, limit: asyncio.Semaphore, step: Callable[[ItemResult, str], Awaitable[None]], result: ItemResult
    ) -> None:
        plan = self.order.plan
        salt = self._salts.salt(result.item.tenant, plan.model.name, result.item.epoch_in(plan.epoch))
        if salt is None:
            result.state, result.reason = "failed", f"no cache-salt secret for tenant {result.item.tenant!r}"
            self._progress(self.report())
            return
        async with limit:
            await step(result, salt)
        self._progress(self.report())

    async def _warm(self, result: ItemResult, salt: str) -> None:
        try:
            warmed = await self._send(result.item, salt)
        except WarmFailed as failure:
            result.state, result.reason = "failed", failure.reason
            return
        result.prompt_tokens = warmed.prompt_tokens
        result.tokens_prefilled = warmed.prompt_tokens - warmed.cached_tokens
        if warmed.prompt_token_ids is not None:
            result.chain = block_chain(warmed.prompt_token_ids, self._client.block_size, salt)
        if self._client.expected_cached_tokens(warmed.prompt_tokens) == 0:
            result.state = "too_short"
            result.reason = f"{warmed.prompt_tokens} tokens: shorter than one block and a token"
        else:
            result.state = "warmed"

    async def _probe(self, result: ItemResult, salt: str) -> None:
        try:
            probed = await self._send(result.item, salt)
        except WarmFailed as failure:
            result.state, result.reason = "failed", f"probe: {failure.reason}"
            return
        expected = self._client.expected_cached_tokens(result.prompt_tokens)
        if probed.cached_tokens >= expected:
            result.state = "verified"
        else:
            result.state = "unverified"
            result.reason = f"probe found {probed.cached_tokens} cached tokens of {expected} expected"

    async def _send(self, item: WarmItem, salt: str) -> WarmResult:
        for attempt in range(1, self._attempts + 1):
            try:
                return await self._client.warm(item.payload, cache_salt=salt, priority=self._priority)
            except WarmFailed as failure:
                if not failure.retryable or attempt == self._attempts:
                    raise
        raise AssertionError("unreachable: the last attempt raises")
