"""The gateway's result cache on real parts: a vLLM engine (CPU), Redis, Postgres with pgvector, the broker.

A repeated greedy request is answered from the cache with the engine's own bytes and never reaches the
engine; another tenant, a bumped epoch, a sampled or streamed request all go to the engine. Identical
requests at once make one engine call, counted by the engine itself.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from typing import Any

import httpx

from tests.integration.gateway_harness import (
    TIMEOUT,
    chat_body,
    engine_served,
    headers,
    metric_sample,
    vllm_requests,
)
from warmplane.services.gateway.service import Gateway
from warmplane.services.gateway.settings import GatewaySettings
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm


async def test_a_gateway_that_starts_holds_the_answers_another_gave_before_it_serves(
    caching_gateway: tuple[GatewaySettings, dict[str, str]], vllm_engine: EmbeddedVllm
) -> None:
    settings, keys = caching_gateway
    body = chat_body(random.Random(uuid.uuid4().int), vllm_engine.model_name)
    acme = headers(keys["acme"])
    async with (
        Gateway(settings) as first,
        httpx.AsyncClient(base_url=first.url, timeout=TIMEOUT) as client,
    ):
        answered = await client.post("/v1/chat/completions", json=body, headers=acme)
        assert (answered.status_code, answered.headers["x-warmplane-cache"]) == (200, "miss")
        assert first.parts is not None and first.parts.results is not None
        await first.parts.results.drain(5)
    before = await vllm_requests(vllm_engine)
    async with (
        Gateway(settings) as second,
        httpx.AsyncClient(base_url=second.url, timeout=TIMEOUT) as client,
    ):
        again = await client.post("/v1/chat/completions", json=body, headers=acme)
        assert (again.headers["x-warmplane-cache"], again.content) == ("l1", answered.content)
        metrics = (await client.get(f"{second.metrics_url}/metrics")).text
    assert metric_sample(metrics, "warmplane_gateway_result_warmed_total") >= 1
    assert await vllm_requests(vllm_engine) == before


async def test_a_repeated_greedy_request_is_answered_from_the_cache_in_its_tenant_and_epoch_only(
    caching_gateway: tuple[GatewaySettings, dict[str, str]], vllm_engine: EmbeddedVllm
) -> None:
    settings, keys = caching_gateway
    model = vllm_engine.model_name
    rng = random.Random(uuid.uuid4().int)
    body = chat_body(rng, model)
    acme, globex = headers(keys["acme"]), headers(keys["globex"])
    before = await vllm_requests(vllm_engine)
    async with (
        Gateway(settings) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=TIMEOUT) as client,
    ):
        first = await client.post("/v1/chat/completions", json=body, headers=acme)
        assert (first.status_code, first.headers["x-warmplane-cache"]) == (200, "miss")
        await engine_served(vllm_engine, before + 1)
        assert gateway.parts is not None and gateway.parts.results is not None
        await gateway.parts.results.drain(5)

        again = await client.post("/v1/chat/completions", json=body, headers=acme)
        assert (again.status_code, again.headers["x-warmplane-cache"]) == (200, "l1")
        assert again.content == first.content
        assert "x-warmplane-replica" not in again.headers

        reasked = {**body, "messages": [*body["messages"][:-1], _shouted(body["messages"][-1])]}
        alike = await client.post("/v1/chat/completions", json=reasked, headers=acme)
        assert (alike.headers["x-warmplane-cache"], alike.content) == ("semantic", first.content)

        # Each of these reaches the engine: one more request served apiece.
        to_engine: list[tuple[dict[str, Any], dict[str, str]]] = [
            (body, globex),
            ({**body, "temperature": 0.8}, acme),
            (body, headers(keys["acme"], **{"cache-control": "no-cache"})),
        ]
        for i, (sent, with_headers) in enumerate(to_engine, start=2):
            response = await client.post("/v1/chat/completions", json=sent, headers=with_headers)
            assert response.status_code == 200
            assert response.headers.get("x-warmplane-cache") == (None if sent is not body else "miss")
            await engine_served(vllm_engine, before + i)

        gateway.parts.epochs.bump("acme", model, 1)
        bumped = await client.post("/v1/chat/completions", json=body, headers=acme)
        assert bumped.headers["x-warmplane-cache"] == "miss"
        await engine_served(vllm_engine, before + 5)

        metrics = (await client.get(f"{gateway.metrics_url}/metrics")).text
    assert metric_sample(metrics, "warmplane_gateway_result_lookups_total", tenant="acme", outcome="l1") == 1
    assert (
        metric_sample(metrics, "warmplane_gateway_result_lookups_total", tenant="acme", outcome="semantic")
        == 1
    )
    assert (
        metric_sample(metrics, "warmplane_gateway_result_lookups_total", tenant="acme", outcome="miss") == 2
    )
    assert (
        metric_sample(metrics, "warmplane_gateway_result_bypass_total", tenant="acme", reason="sampling") == 1
    )


async def test_twenty_identical_requests_at_once_make_one_engine_call(
    caching_gateway: tuple[GatewaySettings, dict[str, str]], vllm_engine: EmbeddedVllm
) -> None:
    settings, keys = caching_gateway
    body = chat_body(random.Random(uuid.uuid4().int), vllm_engine.model_name, max_tokens=32)
    before = await vllm_requests(vllm_engine)
    async with (
        Gateway(settings) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=TIMEOUT) as client,
    ):
        sent = [
            client.post("/v1/chat/completions", json=body, headers=headers(keys["acme"])) for _ in range(20)
        ]
        answers = await asyncio.gather(*sent)
        assert gateway.parts is not None and gateway.parts.results is not None
        await gateway.parts.results.drain(5)
    assert {response.status_code for response in answers} == {200}
    assert len({response.content for response in answers}) == 1, "every request got the engine's one answer"
    sources = Counter(response.headers["x-warmplane-cache"] for response in answers)
    assert sources["miss"] == 1 and set(sources) <= {"miss", "flight", "l1"}, sources
    await engine_served(vllm_engine, before + 1)
    assert await vllm_requests(vllm_engine) == before + 1


def _shouted(message: dict[str, Any]) -> dict[str, Any]:
    """The same question in capitals without its full stop: alike in the embedding, not in the key."""
    return {**message, "content": message["content"].upper().rstrip(".")}
