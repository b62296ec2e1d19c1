"""Running a warm plan against the memory engine (`memory_engine.py`, no sockets): salts, the warm and
probe passes, retries, the concurrency bound and cancellation."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import SecretStr

from tests.unit.warmer.memory_engine import MemoryEngine, Sent
from warmplane.services.warmer.core.replica import RunOrder, held_key, keys_of
from warmplane.services.warmer.plan_run import PlanRun, RunReport
from warmplane.services.warmer.vllm_client import WarmFailed
from warmplane.shared.cache_salt import SaltBook, derive_cache_salt
from warmplane.shared.events import ModelRef, PrefixPayload, WarmItem, WarmPlanIssued

BLOCK = 4
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
MODEL = ModelRef("m", "r1")
EPOCH = 3
SECRETS = {"acme": SecretStr("acme-secret"), "globex": SecretStr("globex-secret")}


def tokens(first: int, count: int) -> list[int]:
    return list(range(first, first + count))


def item(prefix_id: int, prompt: list[int], tenant: str = "acme") -> WarmItem:
    return WarmItem(prefix_id, len(prompt), PrefixPayload(prefix_id, prompt=prompt), tenant, "v1")


def order(items: list[WarmItem], *, concurrency: int = 4, held: tuple[WarmItem, ...] = ()) -> RunOrder:
    plan = WarmPlanIssued(
        event_id=uuid.UUID(int=1),
        occurred_at=NOW,
        producer="planner",
        model=MODEL,
        plan_id=uuid.UUID(int=2),
        replica="replica-0",
        node="node-0",
        epoch=EPOCH,
        items=[*held, *items],
        budget_tokens=10_000,
        deadline=NOW + timedelta(minutes=5),
    )
    return RunOrder(plan, items, len(held), concurrency, [])


def salt(tenant: str) -> str:
    return derive_cache_salt(SECRETS[tenant], tenant, MODEL.name, EPOCH)


async def run(run_order: RunOrder, engine: MemoryEngine, *, attempts: int = 2) -> RunReport:
    return await PlanRun(run_order, engine, SaltBook(SECRETS), priority=10, attempts=attempts).run()


async def test_every_item_verifies_under_its_tenants_salt() -> None:
    engine = MemoryEngine(block_size=BLOCK)
    parent, child = tokens(0, 10), tokens(0, 22)
    items = [item(2, child), item(1, parent), item(3, parent, tenant="globex")]
    run_order = order(items, concurrency=1)

    report = await run(run_order, engine)

    assert report.verified == keys_of(run_order.plan, items)
    assert (report.items_done, report.needed, report.failures) == (3, 3, [])
    sent = {(tuple(request.payload.prompt or ()), request.cache_salt) for request in engine.requests}
    assert sent == {
        (tuple(parent), salt("acme")),
        (tuple(child), salt("acme")),
        (tuple(parent), salt("globex")),
    }
    assert all(request.priority == 10 for request in engine.requests)
    # Shortest first, so the child reuses its parent's 2 blocks; the other tenant's salt shares nothing.
    assert [len(request.payload.prompt or ()) for request in engine.requests[:3]] == [10, 10, 22]
    assert report.tokens_prefilled == 10 + 10 + (22 - 8)


async def test_a_prefix_evicted_between_warm_and_probe_is_unverified_with_the_counts() -> None:
    engine = MemoryEngine(block_size=BLOCK)
    kept, evicted = tokens(0, 10), tokens(100, 18)
    items = [item(1, kept), item(2, evicted)]
    run_order = order(items)

    async def evict_before_the_probe(request: Sent) -> None:
        if request.payload.prompt == evicted and engine.sent(evicted) == 2:
            engine.evict(evicted, keep_blocks=2)

    engine.on_warm = evict_before_the_probe
    report = await run(run_order, engine)

    assert report.verified == keys_of(run_order.plan, items[:1])
    assert report.failures == ["prefix 2: probe found 8 cached tokens of 16 expected"]
    assert (report.items_done, report.needed) == (2, 2)


async def test_a_rejected_request_fails_its_item_without_a_retry() -> None:
    engine = MemoryEngine(block_size=BLOCK)
    good, rejected = tokens(0, 10), tokens(100, 10)
    engine.script(rejected, WarmFailed("POST /v1/completions: HTTP 400: prompt too long"))
    items = [item(1, good), item(2, rejected)]
    run_order = order(items)

    report = await run(run_order, engine, attempts=3)

    assert engine.sent(rejected) == 1
    assert report.failures == ["prefix 2: POST /v1/completions: HTTP 400: prompt too long"]
    assert report.verified == keys_of(run_order.plan, items[:1])
    assert report.items_done == 2


async def test_a_transient_failure_is_retried_and_the_retry_succeeds() -> None:
    engine = MemoryEngine(block_size=BLOCK)
    flaky = tokens(0, 10)
    engine.script(flaky, WarmFailed("POST /v1/completions: HTTP 503: overloaded", retryable=True))
    run_order = order([item(1, flaky)])

    report = await run(run_order, engine, attempts=2)

    assert engine.sent(flaky) == 3  # the failed try, its retry, the probe
    assert report.verified == keys_of(run_order.plan, run_order.items)
    assert report.failures == []


async def test_a_transient_failure_fails_the_item_after_the_last_attempt() -> None:
    engine = MemoryEngine(block_size=BLOCK)
    down = tokens(0, 10)
    engine.script(down, *[WarmFailed("POST /v1/completions: HTTP 503: overloaded", retryable=True)] * 5)

    report = await run(order([item(1, down)]), engine, attempts=3)

    assert engine.sent(down) == 3
    assert report.failures == ["prefix 1: POST /v1/completions: HTTP 503: overloaded"]
    assert report.verified == frozenset()


async def test_an_item_of_a_tenant_without_a_secret_fails_without_a_request() -> None:
    engine = MemoryEngine(block_size=BLOCK)
    known, unknown = tokens(0, 10), tokens(100, 10)
    items = [item(1, known), item(2, unknown, tenant="ghost")]
    run_order = order(items)

    report = await run(run_order, engine)

    assert engine.sent(unknown) == 0
    assert report.failures == ["prefix 2: no cache-salt secret for tenant 'ghost'"]
    assert report.verified == keys_of(run_order.plan, items[:1])
    assert (report.items_done, report.needed) == (2, 2)


async def test_a_prompt_under_a_block_and_a_token_is_too_short_and_not_needed() -> None:
    engine = MemoryEngine(block_size=BLOCK)
    short, shortest_cacheable = tokens(0, BLOCK), tokens(100, BLOCK + 1)
    items = [item(1, short), item(2, shortest_cacheable)]
    run_order = order(items)

    report = await run(run_order, engine)

    assert engine.sent(short) == 1  # warmed, never probed
    assert report.verified == keys_of(run_order.plan, items[1:])
    assert (report.items_done, report.needed, report.failures) == (2, 1, [])
    assert report.outcome().fraction == 1.0


async def test_held_items_count_as_done_and_reach_the_outcome() -> None:
    engine = MemoryEngine(block_size=BLOCK)
    held = (item(1, tokens(0, 10)), item(2, tokens(100, 10)))
    run_order = order([item(3, tokens(200, 10))], held=held)

    outcome = (await run(run_order, engine)).outcome("stopped early")

    assert (outcome.already_held, outcome.needed, outcome.stopped) == (2, 1, "stopped early")
    assert outcome.verified == {held_key(run_order.plan, run_order.items[0])}
    assert outcome.fraction == 1.0
    assert len(engine.requests) == 2  # the one item to warm, and its probe


@pytest.mark.parametrize("concurrency", [1, 3])
async def test_requests_in_flight_never_exceed_the_orders_concurrency(concurrency: int) -> None:
    engine = MemoryEngine(block_size=BLOCK)
    items = [item(n, tokens(100 * n, 10)) for n in range(12)]

    report = await run(order(items, concurrency=concurrency), engine)

    assert engine.peak_in_flight == concurrency
    assert len(report.verified) == 12


async def test_progress_is_reported_as_items_finish() -> None:
    engine = MemoryEngine(block_size=BLOCK)
    seen: list[RunReport] = []
    items = [item(n, tokens(100 * n, 10)) for n in range(3)]

    running = PlanRun(order(items), engine, SaltBook(SECRETS), priority=10, attempts=1, progress=seen.append)
    final = await running.run()

    done = [report.items_done for report in seen]
    assert done == sorted(done)
    assert seen[-1] == final


async def test_a_cancelled_run_reports_what_it_finished() -> None:
    engine = MemoryEngine(block_size=BLOCK)
    first, second, last = tokens(0, 10), tokens(100, 14), tokens(200, 18)
    items = [item(1, first), item(2, second), item(3, last)]
    probe_of_last_sent, never = asyncio.Event(), asyncio.Event()

    async def hold_the_probe_of_the_last(request: Sent) -> None:
        if request.payload.prompt == last and engine.sent(last) == 2:
            probe_of_last_sent.set()
            await never.wait()

    engine.on_warm = hold_the_probe_of_the_last
    run_order = order(items, concurrency=1)
    running = PlanRun(run_order, engine, SaltBook(SECRETS), priority=10, attempts=2)
    task = asyncio.create_task(running.run())
    async with asyncio.timeout(5):
        await probe_of_last_sent.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    report = running.report()
    assert report.verified == keys_of(run_order.plan, items[:2])
    assert (report.items_total, report.items_done, report.needed, report.failures) == (3, 2, 3, [])
    assert report.tokens_prefilled == 10 + 14 + 18
