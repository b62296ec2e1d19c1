"""The embedded vLLM engine serves SmolLM2-135M-Instruct (a real model) under a replica name and an alias.

One engine for the module, started as ``--served-model-name smol-r0 smol``: clients ask for ``smol``, every
answer names ``smol-r0``. Each test's system prompt carries a fresh nonce, so the tests never reuse each
other's cached blocks.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, EmbeddedVllm, ensure_smollm2

_TIMEOUT = httpx.Timeout(120.0, connect=5.0)
_REPLICA, _ALIAS = "smol-r0", "smol"
_MAX_TOKENS = 24
#: About 400 tokens: several whole blocks, so the cache rule has something to count.
_SYSTEM_TEXT = "You are a concise geography tutor. Answer in one short sentence. " * 30

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class _Streamed:
    text: str
    models: set[str]
    usage: dict[str, Any]


@pytest.fixture(scope="module")
def smol_engine() -> Iterator[EmbeddedVllm]:
    """SmolLM2 on one engine, prefix caching on 32-token blocks; built from the wheel first if needed."""
    model_dir = ensure_smollm2()
    with (
        tempfile.TemporaryDirectory(prefix="warmplane-test-smollm2-") as folder,
        EmbeddedVllm(
            Path(folder), model_dir, served_model_name=_REPLICA, served_model_aliases=[_ALIAS]
        ) as engine,
    ):
        yield engine


def _conversation_start() -> Messages:
    return [
        {"role": "system", "content": f"[{uuid.uuid4().hex}] {_SYSTEM_TEXT}"},
        {"role": "user", "content": "What is the capital of France?"},
    ]


async def _stream_chat(client: httpx.AsyncClient, messages: Messages) -> _Streamed:
    """A streamed chat completion asked of the alias; its text, the models its chunks name, its usage."""
    body = {
        "model": _ALIAS,
        "messages": messages,
        "max_tokens": _MAX_TOKENS,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text, models, usage = "", set(), None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            models.add(chunk["model"])
            for choice in chunk.get("choices") or []:
                text += choice.get("delta", {}).get("content") or ""
            usage = chunk.get("usage") or usage
    assert usage is not None, "no usage chunk although stream_options.include_usage was set"
    return _Streamed(text, models, usage)


async def _tokenize(client: httpx.AsyncClient, messages: Messages) -> list[int]:
    body = {"model": _ALIAS, "messages": messages, "add_generation_prompt": True}
    response = await client.post("/tokenize", json=body)
    assert response.status_code == 200, response.text
    tokens: list[int] = response.json()["tokens"]
    return tokens


def _cached(usage: dict[str, Any]) -> int:
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


async def test_streamed_chat_answers_under_the_first_served_name(smol_engine: EmbeddedVllm) -> None:
    async with httpx.AsyncClient(base_url=smol_engine.base_url, timeout=_TIMEOUT) as client:
        listed = (await client.get("/v1/models")).json()["data"]
        streamed = await _stream_chat(client, _conversation_start())
    assert {entry["id"] for entry in listed} == {_REPLICA, _ALIAS}
    assert streamed.text.strip(), "the model answered nothing"
    assert streamed.models == {_REPLICA}
    assert 0 < streamed.usage["completion_tokens"] <= _MAX_TOKENS


async def test_extended_conversation_reuses_the_first_turns_blocks(smol_engine: EmbeddedVllm) -> None:
    first = _conversation_start()
    async with httpx.AsyncClient(base_url=smol_engine.base_url, timeout=_TIMEOUT) as client:
        cold = await _stream_chat(client, first)
        extended = [
            *first,
            {"role": "assistant", "content": cold.text},
            {"role": "user", "content": "And the capital of Germany?"},
        ]
        warm = await _stream_chat(client, extended)
        first_ids, extended_ids = await _tokenize(client, first), await _tokenize(client, extended)
    assert cold.usage["prompt_tokens"] == len(first_ids)
    assert warm.usage["prompt_tokens"] == len(extended_ids)
    assert _cached(cold.usage) == 0
    # Only whole blocks count, and the last prompt token is always recomputed. At least the blocks of the
    # first prompt inside the shared prefix are reused; blocks the first answer filled are cached too, but
    # not beyond what the first request computed (every token but the last one it sampled).
    least = BLOCK_SIZE * min(
        _common_prefix(first_ids, extended_ids) // BLOCK_SIZE, (len(extended_ids) - 1) // BLOCK_SIZE
    )
    most = BLOCK_SIZE * ((cold.usage["prompt_tokens"] + cold.usage["completion_tokens"] - 1) // BLOCK_SIZE)
    cached = _cached(warm.usage)
    assert 0 < least <= cached <= most
    assert cached % BLOCK_SIZE == 0


async def test_tokenizer_adds_no_bos_so_rendered_chat_text_tokenizes_the_same(
    smol_engine: EmbeddedVllm,
) -> None:
    messages = _conversation_start()
    async with httpx.AsyncClient(base_url=smol_engine.base_url, timeout=_TIMEOUT) as client:
        chat_ids = await _tokenize(client, messages)
        text = (await client.post("/detokenize", json={"model": _ALIAS, "tokens": chat_ids})).json()["prompt"]
        # add_special_tokens is true for completions by default: with a BOS-adding tokenizer this would shift.
        body = {"model": _ALIAS, "prompt": text, "add_special_tokens": True}
        text_ids = (await client.post("/tokenize", json=body)).json()["tokens"]
    assert text.startswith("<|im_start|>system\n")
    assert text_ids == chat_ids
