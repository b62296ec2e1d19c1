"""The warmer's vLLM client against the real engine: warm-ups land where the next real request reads them.

Conversations are made of words from a generator seeded afresh per test, and salts are derived from a
fresh secret, so tests sharing the session's engine never hit each other's cached blocks. Expectations
come from the measured rule (NOTES-parts): a real request finds cached
``32 * min(common // 32, (prompt_tokens - 1) // 32)`` tokens, ``common`` being the token prefix it shares
with the warm-up.
"""

from __future__ import annotations

import random
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.integration.warmer_harness import real_chat
from warmplane.services.warmer.vllm_client import VllmEngineClient, WarmFailed
from warmplane.shared.cache_salt import derive_cache_salt
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, EmbeddedVllm
from warmplane.shared.events import PrefixPayload

_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
Message = dict[str, Any]


def _words(rng: random.Random, count: int) -> str:
    words = ("".join(rng.choices(_LETTERS, k=rng.randint(2, 9))) for _ in range(count))
    return " ".join(words).capitalize() + "."


def _conversation(rng: random.Random) -> list[Message]:
    """System, user and assistant turns: well over 600 tokens on the tiny tokenizer."""
    return [
        {"role": "system", "content": _words(rng, 150)},
        {"role": "user", "content": _words(rng, 100)},
        {"role": "assistant", "content": _words(rng, 80)},
    ]


def _salt(tenant: str, engine: EmbeddedVllm, secret: bytes, epoch: int = 1) -> str:
    return derive_cache_salt(secret, tenant, engine.model_name, epoch)


@pytest.fixture
def rng() -> random.Random:
    return random.Random(uuid.uuid4().int)


@pytest.fixture
def secret() -> bytes:
    return uuid.uuid4().bytes


@pytest.fixture
async def client(vllm_engine: EmbeddedVllm) -> AsyncIterator[VllmEngineClient]:
    async with VllmEngineClient(
        vllm_engine.base_url,
        vllm_engine.model_name,
        connect_timeout_s=5.0,
        request_timeout_s=60.0,
        block_size=BLOCK_SIZE,
    ) as engine_client:
        yield engine_client


async def _tokenize(engine: EmbeddedVllm, **request: Any) -> list[int]:
    async with httpx.AsyncClient(base_url=engine.base_url, timeout=_TIMEOUT) as http:
        response = await http.post("/tokenize", json={"model": engine.model_name, **request})
    assert response.status_code == 200, response.text
    tokens: list[int] = response.json()["tokens"]
    return tokens


def _cached(usage: dict[str, Any]) -> int:
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


async def test_warmed_conversation_is_reused_by_the_next_real_turn(
    vllm_engine: EmbeddedVllm, client: VllmEngineClient, rng: random.Random, secret: bytes
) -> None:
    conversation = _conversation(rng)
    salt = _salt("tenant-a", vllm_engine, secret)
    payload = PrefixPayload(prefix_id=1, messages=conversation)

    warmed = await client.warm(payload, cache_salt=salt)
    assert warmed.prompt_tokens >= 600
    assert warmed.cached_tokens == 0
    assert warmed.elapsed_s > 0
    probed = await client.probe(payload, cache_salt=salt)
    assert probed == client.expected_cached_tokens(warmed.prompt_tokens) > 0

    real_turn = [*conversation, {"role": "user", "content": _words(rng, 20)}]
    usage = await real_chat(vllm_engine, real_turn, salt)
    warm_ids = await client.tokenize(payload)
    real_ids = await _tokenize(vllm_engine, messages=real_turn, add_generation_prompt=True)
    assert len(warm_ids) == warmed.prompt_tokens
    assert len(real_ids) == usage["prompt_tokens"]
    # The warm-up's rendering is a strict token prefix of the real turn's, so all its whole blocks count.
    assert real_ids[: len(warm_ids)] == warm_ids  # the warm renders to a strict token prefix
    full_blocks = BLOCK_SIZE * (warmed.prompt_tokens // BLOCK_SIZE)
    assert _cached(usage) == full_blocks >= probed
    assert _cached(usage) % BLOCK_SIZE == 0


async def test_another_tenants_salt_finds_nothing(
    vllm_engine: EmbeddedVllm, client: VllmEngineClient, rng: random.Random, secret: bytes
) -> None:
    conversation = _conversation(rng)
    payload = PrefixPayload(prefix_id=1, messages=conversation)
    warmed = await client.warm(payload, cache_salt=_salt("tenant-a", vllm_engine, secret))
    real_turn = [*conversation, {"role": "user", "content": _words(rng, 20)}]

    other_tenant = await real_chat(vllm_engine, real_turn, _salt("tenant-b", vllm_engine, secret))
    next_epoch = await real_chat(vllm_engine, real_turn, _salt("tenant-a", vllm_engine, secret, epoch=2))
    same_tenant = await real_chat(vllm_engine, real_turn, _salt("tenant-a", vllm_engine, secret))
    assert _cached(other_tenant) == 0
    assert _cached(next_epoch) == 0
    assert _cached(same_tenant) == BLOCK_SIZE * (warmed.prompt_tokens // BLOCK_SIZE)


async def test_an_unsalted_warm_serves_unsalted_traffic_and_no_salted_tenant(
    vllm_engine: EmbeddedVllm, client: VllmEngineClient, rng: random.Random, secret: bytes
) -> None:
    """`WARMPLANE_UNSALTED_TENANTS`: behind a router that adds no salt, the warm must carry none either."""
    conversation = _conversation(rng)
    payload = PrefixPayload(prefix_id=1, messages=conversation)
    warmed = await client.warm(payload, cache_salt="")
    real_turn = [*conversation, {"role": "user", "content": _words(rng, 20)}]

    salted = await real_chat(vllm_engine, real_turn, _salt("tenant-a", vllm_engine, secret))
    unsalted = await real_chat(vllm_engine, real_turn, None)
    assert _cached(salted) == 0
    assert _cached(unsalted) == BLOCK_SIZE * (warmed.prompt_tokens // BLOCK_SIZE) > 0


async def test_chat_rendered_token_ids_warm_the_chat_path(
    vllm_engine: EmbeddedVllm, client: VllmEngineClient, rng: random.Random, secret: bytes
) -> None:
    conversation = _conversation(rng)
    salt = _salt("tenant-a", vllm_engine, secret)
    token_ids = await client.tokenize(PrefixPayload(prefix_id=1, messages=conversation))

    warmed = await client.warm(PrefixPayload(prefix_id=1, prompt=token_ids), cache_salt=salt)
    real_turn = [*conversation, {"role": "user", "content": _words(rng, 20)}]
    usage = await real_chat(vllm_engine, real_turn, salt)
    assert _cached(usage) == BLOCK_SIZE * (warmed.prompt_tokens // BLOCK_SIZE) > 0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_an_absent_engine_is_unhealthy_and_fails_warm_ups_quickly() -> None:
    base_url = f"http://127.0.0.1:{_free_port()}"
    payload = PrefixPayload(prefix_id=1, messages=[{"role": "system", "content": "Be brief."}])
    async with VllmEngineClient(
        base_url,
        "tiny-llama",
        connect_timeout_s=1.0,
        request_timeout_s=30.0,
        health_timeout_s=1.0,
        block_size=32,
    ) as client:
        assert await client.health() is False
        started = time.monotonic()
        with pytest.raises(WarmFailed) as failure:
            await client.warm(payload, cache_salt="s")
    assert time.monotonic() - started < 2.0
    assert "ConnectError" in failure.value.reason or "timed out" in failure.value.reason
    assert base_url in failure.value.reason
