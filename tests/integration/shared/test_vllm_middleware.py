"""Events from inside vLLM (issue 17, item 2): a real `vllm serve` (the CPU build, the tiny model) with
Warmplane's middleware, the light package on its path as a team would install it beside vLLM, and traffic
sent straight to it, with no gateway. The planner counts what the middleware publishes, with vLLM's own
cached-token figures, and a new replica behind a warmer is planned from those events alone, warmed without a
salt (the traffic carries none: `WARMPLANE_UNSALTED_TENANTS`), and then serves the conversations from its
cache.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.light_install import BesideVllm
from tests.integration.planner_harness import events_on, poll_until
from tests.integration.warmer_harness import (
    Message,
    conversation,
    counted,
    full_blocks,
    real_chat,
    wait_for,
    warmer_settings,
)
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.settings import PlannerSettings
from warmplane.services.warmer.service import Warmer
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, EmbeddedVllm, ensure_tiny_model
from warmplane.shared.events import RequestObserved
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.topics import Topics

MIDDLEWARE = "warmplane.shared.vllm_middleware.WarmplaneEvents"
REPLICA = "replica-observed"
TENANT = "acme"
_TIMEOUT_S = 90.0


@pytest.fixture
def observed_engine(
    light_beside_vllm: BesideVllm, planner_settings: PlannerSettings, tmp_path: Path
) -> Iterator[EmbeddedVllm]:
    """The tiny model served by `vllm serve` with the middleware, publishing to the planner's topics."""
    kafka = planner_settings.kafka
    env = {
        "PYTHONPATH": str(light_beside_vllm.folder),
        "WARMPLANE_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "WARMPLANE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
        "WARMPLANE_REPLICA": REPLICA,
        "WARMPLANE_TENANT": TENANT,
        "WARMPLANE_BLOCK_SIZE": str(BLOCK_SIZE),
    }
    with EmbeddedVllm(
        tmp_path / "vllm",
        ensure_tiny_model(),
        extra_args=("--middleware", MIDDLEWARE, "--enable-force-include-usage"),
        extra_env=env,
        omp_threads_bind=1,
    ) as engine:
        yield engine


async def _chat(engine: EmbeddedVllm, messages: list[Message], *, stream: bool) -> dict[str, Any]:
    """A client's chat request straight to the engine, streamed or not; the usage the client got."""
    body = {"model": engine.model_name, "messages": messages, "max_tokens": 2, "stream": stream}
    async with httpx.AsyncClient(base_url=engine.base_url, timeout=60.0) as http:
        response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    if not stream:
        usage: dict[str, Any] = response.json()["usage"]
        return usage
    chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    usage = [chunk["usage"] for chunk in chunks if chunk.get("usage")][-1]  # the figures so far, per chunk
    assert isinstance(usage, dict)
    return usage


def _cached(usage: dict[str, Any]) -> int:
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


async def test_the_middleware_feeds_the_planner_and_a_new_replica_is_warmed_from_it(
    planner_settings: PlannerSettings, observed_engine: EmbeddedVllm, vllm_engine: EmbeddedVllm
) -> None:
    rng = random.Random(uuid.uuid4().int)
    kafka = planner_settings.kafka
    await ensure_topics(kafka, Topics(kafka.topic_prefix).all())
    conversations = [conversation(rng) for _ in range(4)]
    answered = [
        await _chat(observed_engine, messages, stream=(turn + i) % 2 == 1)
        for turn in range(3)
        for i, messages in enumerate(conversations)
    ]
    assert any(_cached(usage) > 0 for usage in answered)  # the repeats found their prefixes

    dsn = planner_settings.postgres.asyncpg_dsn()
    async with running_planner(planner_settings):
        await poll_until(
            lambda: counted(dsn, len(answered)), timeout_s=_TIMEOUT_S, what="the traffic counted"
        )
        events = await events_on(kafka, Topics(kafka.topic_prefix).requests, RequestObserved)
        assert {(e.tenant, e.replica, e.model.name) for e in events} == {
            (TENANT, REPLICA, vllm_engine.model_name)
        }
        # vLLM's own figures, request for request, and each conversation's payload sent once.
        seen = sorted((e.prompt_tokens, e.cached_tokens) for e in events)
        assert seen == sorted((usage["prompt_tokens"], _cached(usage)) for usage in answered)
        sent_payloads = [json.dumps(e.payload.messages) for e in events if e.payload is not None]
        assert sorted(sent_payloads) == sorted(json.dumps(messages) for messages in conversations)

        # A new replica, on another engine, is planned from those events and warmed without a salt.
        settings = warmer_settings(kafka, [vllm_engine], node="node-new", secrets={})
        settings = settings.model_copy(update={"unsalted_tenants": [TENANT]})
        async with Warmer(settings) as warmer:
            [driver] = warmer.drivers.values()
            await wait_for(lambda: driver.tracker.ready, timeout_s=_TIMEOUT_S, what="the new replica ready")
            assert len(driver.tracker.held) == len(conversations), driver.tracker.reason
            for messages in conversations:  # the next turn, sent with no salt, as the team's router sends it
                turn = [*messages, {"role": "user", "content": "and then?"}]
                usage = await real_chat(vllm_engine, turn, None)
                assert _cached(usage) >= await full_blocks(vllm_engine, messages) > 0
