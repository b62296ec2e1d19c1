"""Running a warm plan against a simulated vLLM engine over an in-memory transport (no sockets): salts, the
warm and probe passes, retries, the concurrency bound and cancellation."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from warmplane.services.warmer.core.replica import RunOrder, held_key, keys_of
from warmplane.services.warmer.plan_run import PlanRun, RunReport
from warmplane.services.warmer.vllm_client import VllmEngineClient
from warmplane.shared.cache_salt import SaltBook, derive_cache_salt
from warmplane.shared.events import ModelRef, PrefixPayload, WarmItem, WarmPlanIssued

BLOCK = 4
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
MODEL = ModelRef("m", "r1")
EPOCH = 3
SECRETS = {"acme": SecretStr("acme-secret"), "globex": SecretStr("globex-secret")}
Handler = Callable[[httpx.Request], Coroutine[None, None, httpx.Response]]


class FakeEngine:
    """A vLLM stand-in for completions on token ids.

    Each cache salt has its own store of full-block prefixes. A request finds its leading blocks that are
    already stored, never the block holding its last token (always recomputed), then stores its own full
    blocks. `script` queues answers (a response, or an exception to raise) given before the real one.
    """

    def __init__(self) -> None:
        self.stored: defaultdict[str, set[tuple[int, ...]]] = defaultdict(set)
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self._scripted: defaultdict[tuple[int, ...], deque[httpx.Response | Exception]] = defaultdict(deque)

    def script(self, prompt: list[int], *answers: httpx.Response | Exception) -> None:
        self._scripted[tuple(prompt)].extend(answers)

    def sent(self, prompt: list[int]) -> int:
        """How many requests carried exactly `prompt`."""
        return sum(body["prompt"] == prompt for body in self.requests)

    def evict(self, prompt: list[int], *, keep_blocks: int = 0) -> None:
        """Forget the blocks of `prompt` after its first `keep_blocks`, under every salt."""
        dropped = {tuple(prompt[: k * BLOCK]) for k in range(keep_blocks + 1, len(prompt) // BLOCK + 1)}
        for store in self.stored.values():
            store.difference_update(dropped)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)  # a real engine overlaps requests: let the others in while this one runs
            scripted = self._scripted[tuple(body["prompt"])]
            if scripted:
                answer = scripted.popleft()
                if isinstance(answer, Exception):
                    raise answer
                return answer
            return httpx.Response(200, json=self._complete(body["prompt"], body["cache_salt"]))
        finally:
            self.in_flight -= 1

    def _complete(self, prompt: list[int], salt: str) -> dict[str, Any]:
        store = self.stored[salt]
        reusable = (len(prompt) - 1) // BLOCK
        cached = 0
        while cached < reusable and tuple(prompt[: (cached + 1) * BLOCK]) in store:
            cached += 1
        store.update(tuple(prompt[: k * BLOCK]) for k in range(1, len(prompt) // BLOCK + 1))
        usage = {"prompt_tokens": len(prompt), "prompt_tokens_details": {"cached_tokens": cached * BLOCK}}
        return {"usage": usage}


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


def client(handler: Handler) -> VllmEngineClient:
    return VllmEngineClient(
        "http://engine:8000",
        MODEL.name,
        connect_timeout_s=1.0,
        request_timeout_s=1.0,
        block_size=BLOCK,
        transport=httpx.MockTransport(handler),
    )


async def run(run_order: RunOrder, handler: Handler, *, attempts: int = 2) -> RunReport:
    async with client(handler) as engine_client:
        return await PlanRun(
            run_order, engine_client, SaltBook(SECRETS), priority=10, attempts=attempts
        ).run()


async def test_every_item_verifies_under_its_tenants_salt() -> None:
    engine = FakeEngine()
    parent, child = tokens(0, 10), tokens(0, 22)
    items = [item(2, child), item(1, parent), item(3, parent, tenant="globex")]
    run_order = order(items, concurrency=1)

    report = await run(run_order, engine.handle)

    assert report.verified == keys_of(run_order.plan, items)
    assert (report.items_done, report.needed, report.failures) == (3, 3, [])
    sent = {(tuple(body["prompt"]), body["cache_salt"]) for body in engine.requests}
    assert sent == {
        (tuple(parent), salt("acme")),
        (tuple(child), salt("acme")),
        (tuple(parent), salt("globex")),
    }
    assert all((body["model"], body["priority"]) == (MODEL.name, 10) for body in engine.requests)
    # Shortest first, so the child reuses its parent's 2 blocks; the other tenant's salt shares nothing.
    assert [len(body["prompt"]) for body in engine.requests[:3]] == [10, 10, 22]
    assert report.tokens_prefilled == 10 + 10 + (22 - 8)


async def test_a_prefix_evicted_between_warm_and_probe_is_unverified_with_the_counts() -> None:
    engine = FakeEngine()
    kept, evicted = tokens(0, 10), tokens(100, 18)
    items = [item(1, kept), item(2, evicted)]
    run_order = order(items)

    async def handler(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["prompt"] == evicted and engine.sent(evicted) == 1:
            engine.evict(evicted, keep_blocks=2)
        return await engine.handle(request)

    report = await run(run_order, handler)

    assert report.verified == keys_of(run_order.plan, items[:1])
    assert report.failures == ["prefix 2: probe found 8 cached tokens of 16 expected"]
    assert (report.items_done, report.needed) == (2, 2)


async def test_a_rejected_request_fails_its_item_without_a_retry() -> None:
    engine = FakeEngine()
    good, rejected = tokens(0, 10), tokens(100, 10)
    engine.script(rejected, httpx.Response(400, json={"error": {"message": "prompt too long"}}))
    items = [item(1, good), item(2, rejected)]
    run_order = order(items)

    report = await run(run_order, engine.handle, attempts=3)

    assert engine.sent(rejected) == 1
    assert report.failures == ["prefix 2: POST /v1/completions: HTTP 400: prompt too long"]
    assert report.verified == keys_of(run_order.plan, items[:1])
    assert report.items_done == 2


@pytest.mark.parametrize(
    "transient",
    [
        httpx.Response(503, json={"message": "overloaded"}),
        httpx.ReadTimeout("slow"),
        httpx.ConnectError("reset"),
    ],
    ids=["http-503", "timeout", "transport-error"],
)
async def test_a_transient_failure_is_retried_and_the_retry_succeeds(
    transient: httpx.Response | Exception,
) -> None:
    engine = FakeEngine()
    flaky = tokens(0, 10)
    engine.script(flaky, transient)
    run_order = order([item(1, flaky)])

    report = await run(run_order, engine.handle, attempts=2)

    assert engine.sent(flaky) == 3  # the failed try, its retry, the probe
    assert report.verified == keys_of(run_order.plan, run_order.items)
    assert report.failures == []


async def test_a_transient_failure_fails_the_item_after_the_last_attempt() -> None:
    engine = FakeEngine()
    down = tokens(0, 10)
    engine.script(down, *[httpx.Response(503, json={"message": "overloaded"})] * 5)

    report = await run(order([item(1, down)]), engine.handle, attempts=3)

    assert engine.sent(down) == 3
    assert report.failures == ["prefix 1: POST /v1/completions: HTTP 503: overloaded"]
    assert report.verified == frozenset()


async def test_an_item_of_a_tenant_without_a_secret_fails_without_a_request() -> None:
    engine = FakeEngine()
    known, unknown = tokens(0, 10), tokens(100, 10)
    items = [item(1, known), item(2, unknown, tenant="ghost")]
    run_order = order(items)

    report = await run(run_order, engine.handle)

    assert engine.sent(unknown) == 0
    assert report.failures == ["prefix 2: no cache-salt secret for tenant 'ghost'"]
    assert report.verified == keys_of(run_order.plan, items[:1])
    assert (report.items_done, report.needed) == (2, 2)


async def test_a_prompt_under_a_block_and_a_token_is_too_short_and_not_needed() -> None:
    engine = FakeEngine()
    short, shortest_cacheable = tokens(0, BLOCK), tokens(100, BLOCK + 1)
    items = [item(1, short), item(2, shortest_cacheable)]
    run_order = order(items)

    report = await run(run_order, engine.handle)

    assert engine.sent(short) == 1  # warmed, never probed
    assert report.verified == keys_of(run_order.plan, items[1:])
    assert (report.items_done, report.needed, report.failures) == (2, 1, [])
    assert report.outcome().fraction == 1.0


async def test_held_items_count_as_done_and_reach_the_outcome() -> None:
    engine = FakeEngine()
    held = (item(1, tokens(0, 10)), item(2, tokens(100, 10)))
    run_order = order([item(3, tokens(200, 10))], held=held)

    outcome = (await run(run_order, engine.handle)).outcome("stopped early")

    assert (outcome.already_held, outcome.needed, outcome.stopped) == (2, 1, "stopped early")
    assert outcome.verified == {held_key(run_order.plan, run_order.items[0])}
    assert outcome.fraction == 1.0
    assert len(engine.requests) == 2  # the one item to warm, and its probe


@pytest.mark.parametrize("concurrency", [1, 3])
async def test_requests_in_flight_never_exceed_the_orders_concurrency(concurrency: int) -> None:
    engine = FakeEngine()
    items = [item(n, tokens(100 * n, 10)) for n in range(12)]

    report = await run(order(items, concurrency=concurrency), engine.handle)

    assert engine.peak_in_flight == concurrency
    assert len(report.verified) == 12


async def test_progress_is_reported_as_items_finish() -> None:
    engine = FakeEngine()
    seen: list[RunReport] = []
    items = [item(n, tokens(100 * n, 10)) for n in range(3)]

    async with client(engine.handle) as engine_client:
        running = PlanRun(
            order(items), engine_client, SaltBook(SECRETS), priority=10, attempts=1, progress=seen.append
        )
        final = await running.run()

    done = [report.items_done for report in seen]
    assert done == sorted(done)
    assert seen[-1] == final


async def test_a_cancelled_run_reports_what_it_finished() -> None:
    engine = FakeEngine()
    first, second, last = tokens(0, 10), tokens(100, 14), tokens(200, 18)
    items = [item(1, first), item(2, second), item(3, last)]
    probe_of_last_sent, never = asyncio.Event(), asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["prompt"] == last and engine.sent(last) == 1:
            probe_of_last_sent.set()
            await never.wait()
        return await engine.handle(request)

    run_order = order(items, concurrency=1)
    async with client(handler) as engine_client:
        running = PlanRun(run_order, engine_client, SaltBook(SECRETS), priority=10, attempts=2)
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
