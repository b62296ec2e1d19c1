"""Residency from the engine's own KV events, on a real vLLM with a small cache: a verified warm is reported
held, traffic that evicts it is seen (and the engine confirms the eviction), and the next plan warms the
evicted prefixes again instead of taking them as held."""

from __future__ import annotations

import random
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.integration.planner_harness import MODEL, events_on, produce
from tests.integration.warmer.test_warmer_faults import warm_plan
from tests.integration.warmer_harness import conversation, real_chat, wait_for, warmer_settings, words
from warmplane.services.warmer.core.kv_index import block_chain
from warmplane.services.warmer.core.replica import Phase
from warmplane.services.warmer.service import Warmer
from warmplane.services.warmer.settings import WarmSettings
from warmplane.shared.cache_salt import derive_cache_salt
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm, ensure_tiny_model
from warmplane.shared.events import PrefixPayload, ReplicaResidency, WarmItem
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics

_TIMEOUT_S = 90.0
_BLOCKS = 160
"""The engine's KV blocks: 5,088 tokens usable, the least vLLM takes for a 4,096-token context."""


@pytest.fixture
def small_engine() -> Iterator[EmbeddedVllm]:
    """An engine of the test's own with a small cache, publishing its KV events; always stopped."""
    with (
        tempfile.TemporaryDirectory(prefix="warmplane-test-vllm-kv-") as folder,
        EmbeddedVllm(
            Path(folder),
            ensure_tiny_model(),
            omp_threads_bind=1,
            kv_events=True,
            extra_args=["--num-gpu-blocks-override", str(_BLOCKS)],
        ) as engine,
    ):
        yield engine


async def test_evicted_warm_prefixes_are_reported_lost_and_warmed_again_by_the_next_plan(
    embedded_kafka: EmbeddedKafka, small_engine: EmbeddedVllm
) -> None:
    rng = random.Random(uuid.uuid4().int)
    secret = uuid.uuid4().hex
    kafka = KafkaSettings(
        bootstrap_servers=embedded_kafka.bootstrap_servers,
        topic_prefix=f"t{uuid.uuid4().hex[:8]}",
        session_timeout_ms=2_000,
        heartbeat_interval_ms=500,
    )
    warm = WarmSettings(health_interval_s=0.2, progress_interval_s=0.2, residency_interval_s=0.2)
    settings = warmer_settings(kafka, [small_engine], node="node-kv", secrets={"acme": secret}, warm=warm)
    conversations = [conversation(rng) for _ in range(4)]
    items = [
        WarmItem(prefix_id, 400, PrefixPayload(prefix_id, messages=messages), "acme")
        for prefix_id, messages in enumerate(conversations, start=1)
    ]
    salt = derive_cache_salt(secret.encode(), "acme", MODEL.name, 0)
    async with Warmer(settings) as warmer:
        [driver] = warmer.drivers.values()
        watch = driver.residency
        assert watch is not None
        await wait_for(lambda: driver.tracker.phase is Phase.LOADING, timeout_s=_TIMEOUT_S, what="loaded")
        deadline = datetime.now(UTC) + timedelta(seconds=60)
        await produce(kafka, [warm_plan(driver.replica, "node-kv", items, deadline)])
        await wait_for(lambda: driver.tracker.ready, timeout_s=_TIMEOUT_S, what="ready")
        assert not driver.tracker.partial, driver.tracker.reason

        def reported(held: int, lost: int) -> bool:
            found = watch.last
            return found is not None and (len(found.held), watch.lost) == (held, lost)

        await wait_for(lambda: reported(4, 0), timeout_s=_TIMEOUT_S, what="the warm reported held")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{warmer.http_port}") as http:
            [status] = (await http.get("/status")).json()["replicas"]
            metrics = (await http.get("/metrics")).text
        residency = status["residency"]
        assert (residency["held"], residency["lost"], residency["events_complete"]) == (4, 0, True)
        assert residency["blocks_known"] > 0 and residency["event_gaps"] == 0
        assert f'warmplane_warmer_resident_prefixes{{replica="{driver.replica}"}} 4.0' in metrics

        async def evict() -> None:
            """Other traffic, twice the cache: the warm's blocks are the least recently used, so they go."""
            for _ in range(2 * _BLOCKS * 32 // 600):
                await real_chat(small_engine, [{"role": "user", "content": words(rng, 300)}], "other-salt")

        await evict()
        await wait_for(lambda: reported(0, 4), timeout_s=_TIMEOUT_S, what="the eviction seen")
        assert driver.tracker.held == set()
        evicted = await real_chat(small_engine, conversations[0], salt)
        assert evicted["prompt_tokens_details"]["cached_tokens"] == 0, "the engine agrees: evicted"

        # The next plan of the same prefixes warms them again: none of them counts as already held.
        again = warm_plan(driver.replica, "node-kv", items, datetime.now(UTC) + timedelta(seconds=60))
        await produce(kafka, [again])
        await wait_for(
            lambda: driver.last_report is not None and driver.last_report.plan_id == again.plan_id,
            timeout_s=_TIMEOUT_S,
            what="the second plan run",
        )
        assert driver.last_report is not None
        assert (driver.last_report.already_held, len(driver.last_report.verified)) == (0, 4)
        await wait_for(lambda: reported(4, 4), timeout_s=_TIMEOUT_S, what="the re-warm reported held")

        # Events lost for good (as a message dropped past the engine's replay buffer would be): what the
        # index cannot find is unsure, and a probe settles it; being the warm request, it fills it again.
        # Probes may run while the eviction traffic still flows: one it evicts again is probed again.
        watch.feed.index.doubt()
        await evict()
        marker = await driver.client.warm(PrefixPayload(0, prompt=words(rng, 80)), cache_salt="marker")
        assert marker.prompt_token_ids is not None
        last_sent = block_chain(marker.prompt_token_ids, driver.client.block_size, "marker")
        assert last_sent.digests
        await wait_for(
            lambda: watch.feed.index.holds(last_sent), timeout_s=_TIMEOUT_S, what="the events of all traffic"
        )

        def settled() -> bool:
            """What the index now knows, with the probes' answers, vouches for all four, as reported."""
            found = watch.residency.assess(driver.tracker.held, watch.feed.index, time.monotonic())
            last = watch.last
            vouched = found.complete and len(found.held) == 4
            return vouched and last is not None and last.complete and reported(4, 4)

        await wait_for(settled, timeout_s=_TIMEOUT_S, what="the probes")
        restored = await real_chat(small_engine, conversations[0], salt)
        assert restored["prompt_tokens_details"]["cached_tokens"] > 0, "the probe filled it again"
        incarnation = driver.tracker.incarnation

    reports = await events_on(kafka, Topics(kafka.topic_prefix).warm_results, ReplicaResidency)
    assert reports and {r.incarnation for r in reports} == {incarnation}
    assert all(r.replica == driver.replica for r in reports)
    held = [sorted(p for group in r.held for p in group.prefix_ids) for r in reports]
    assert [1, 2, 3, 4] in held and [] in held
    assert any(not r.complete for r in reports), "unsure until probed"
    assert (held[-1], reports[-1].lost, reports[-1].complete) == ([1, 2, 3, 4], 4, True)
