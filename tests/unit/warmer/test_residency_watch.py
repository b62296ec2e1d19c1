"""The residency watch against failures: an engine that fails every probe gets a rest between attempts
(a refused connection fails at once), and a subscription that fails is doubted and tried again."""

from __future__ import annotations

import asyncio
import contextlib

from pydantic import SecretStr

from tests.unit.warmer.memory_engine import MemoryEngine
from warmplane.services.warmer.core.kv_index import block_chain
from warmplane.services.warmer.residency_watch import ResidencyWatch
from warmplane.services.warmer.settings import EngineSettings, WarmSettings
from warmplane.shared.cache_salt import SaltBook
from warmplane.shared.events import HeldPrefixes, PrefixPayload

KEY = ("acme", "m", "", 0, 7)


async def test_a_failed_probe_is_not_retried_at_once() -> None:
    engine = MemoryEngine(block_size=4, answering=False)  # every probe is refused
    reports: list[tuple[list[HeldPrefixes], int, bool]] = []
    watch = ResidencyWatch(
        engine=EngineSettings(
            replica="r0", url="http://127.0.0.1:9", served_model="m", kv_events_endpoint="ipc:///tmp/none"
        ),
        warm=WarmSettings(),
        client=engine,
        salts=SaltBook({"acme": SecretStr("secret")}),
        report=lambda held, lost, complete: reports.append((held, lost, complete)),
        wake=lambda: None,
    )
    watch.residency.learn(
        {KEY: block_chain(list(range(9)), 4, "salt")}, {KEY: PrefixPayload(7, prompt="x")}, now=-100.0, seq=-1
    )
    watch.feed.index.lose(3)  # events were lost: the index cannot vouch for the prefix
    held = {KEY}
    for _ in range(5):
        watch.step(held, idle=True, forget=held.difference_update)
        probing = watch._probing
        if probing is not None:
            await probing
    assert len(engine.requests) == 1
    assert reports and reports[-1][2] is False, "unsure until a probe settles it"
    assert held == {KEY}, "a prefix no probe could check stays held"


async def test_a_failed_subscription_doubts_the_index_and_is_tried_again() -> None:
    woken = asyncio.Event()
    watch = ResidencyWatch(
        engine=EngineSettings(
            replica="r0", url="http://127.0.0.1:9", served_model="m", kv_events_endpoint="tcp://no-port"
        ),
        warm=WarmSettings(),
        client=MemoryEngine(answering=False),
        salts=SaltBook({}),
        report=lambda held, lost, complete: None,
        wake=woken.set,
    )
    running = asyncio.create_task(watch.run())
    try:
        async with asyncio.timeout(10):
            await woken.wait()
        assert not running.done(), "the watch goes on after the failure"
        assert (watch.feed.index.complete, watch.feed.index.gaps) == (False, 1)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
