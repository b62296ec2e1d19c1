"""The embedded vLLM engine serves the tiny model, caches prefixes in 32-token blocks and honours cache_salt.

Prompts are token ids drawn from a seeded generator with a fresh nonce per test, so tests sharing the
session's engine never hit each other's cached blocks, and the prompt length is exact.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import httpx

from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, EmbeddedVllm

_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
_PROMPT_TOKENS = 1_000
#: Ids below this are the tiny tokenizer's special tokens; the vocabulary holds 8,192 ids.
_FIRST_PLAIN_ID, _VOCAB_SIZE = 4, 8192


def _token_prompt(length: int = _PROMPT_TOKENS) -> list[int]:
    rng = random.Random(uuid.uuid4().int)
    return [rng.randrange(_FIRST_PLAIN_ID, _VOCAB_SIZE) for _ in range(length)]


async def _complete(
    client: httpx.AsyncClient, engine: EmbeddedVllm, prompt: list[int], **extra: Any
) -> dict[str, Any]:
    body = {"model": engine.model_name, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, **extra}
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    usage: dict[str, Any] = response.json()["usage"]
    return usage


def _cached(usage: dict[str, Any]) -> int:
    details = usage.get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


async def test_chat_completion_answers_with_usage(vllm_engine: EmbeddedVllm) -> None:
    body = {
        "model": vllm_engine.model_name,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}],
        "max_tokens": 1,
    }
    async with httpx.AsyncClient(base_url=vllm_engine.base_url, timeout=_TIMEOUT) as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] == 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + 1


async def test_repeated_prompt_reuses_whole_blocks(vllm_engine: EmbeddedVllm) -> None:
    prompt = _token_prompt()
    async with httpx.AsyncClient(base_url=vllm_engine.base_url, timeout=_TIMEOUT) as client:
        cold = await _complete(client, vllm_engine, prompt)
        warm = await _complete(client, vllm_engine, prompt)
    assert cold["prompt_tokens"] == warm["prompt_tokens"] == _PROMPT_TOKENS
    assert _cached(cold) == 0
    # The last prompt token is always recomputed, and only whole blocks are reused.
    expected = BLOCK_SIZE * ((warm["prompt_tokens"] - 1) // BLOCK_SIZE)
    assert _cached(warm) == expected > 0
    assert _cached(warm) % BLOCK_SIZE == 0


async def test_cache_salt_isolates_identical_prompts(vllm_engine: EmbeddedVllm) -> None:
    prompt = _token_prompt()
    salt_a, salt_b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"
    async with httpx.AsyncClient(base_url=vllm_engine.base_url, timeout=_TIMEOUT) as client:
        await _complete(client, vllm_engine, prompt, cache_salt=salt_a)
        same_salt = await _complete(client, vllm_engine, prompt, cache_salt=salt_a)
        other_salt = await _complete(client, vllm_engine, prompt, cache_salt=salt_b)
        unsalted = await _complete(client, vllm_engine, prompt)
        other_again = await _complete(client, vllm_engine, prompt, cache_salt=salt_b)
    full = BLOCK_SIZE * ((_PROMPT_TOKENS - 1) // BLOCK_SIZE)
    assert _cached(same_salt) == full
    assert _cached(other_salt) == 0
    assert _cached(unsalted) == 0
    assert _cached(other_again) == full
