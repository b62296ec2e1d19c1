"""Running a warmer against real engines in integration tests, and traffic whose prefixes can be warmed."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import httpx
from pydantic import SecretStr

from tests.integration.planner_harness import request
from warmplane.services.devstack.fleet import engine_settings
from warmplane.services.warmer.settings import (
    ReadinessSettings,
    WarmerSettings,
    WarmSettings,
)
from warmplane.services.warmer.vllm_client import VllmEngineClient
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, EmbeddedVllm
from warmplane.shared.events import PrefixPayload, RequestObserved
from warmplane.shared.settings import KafkaSettings

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
Message = dict[str, Any]


def words(rng: random.Random, count: int) -> str:
    return " ".join("".join(rng.choices(_LETTERS, k=rng.randint(2, 9))) for _ in range(count)) + "."


def conversation(rng: random.Random, words_per_turn: int = 60) -> list[Message]:
    """A system prompt and one exchange: a few hundred tokens on the tiny tokenizer."""
    return [
        {"role": "system", "content": words(rng, words_per_turn)},
        {"role": "user", "content": words(rng, words_per_turn)},
        {"role": "assistant", "content": words(rng, words_per_turn // 2)},
    ]


def conversation_traffic(
    rng: random.Random, conversations: int, *, repeats: int, tenant: str = "acme"
) -> tuple[list[RequestObserved], dict[int, list[Message]]]:
    """`repeats` requests through each of `conversations` chains [root, leaf], the first one carrying the
    leaf's chat payload; and the payload of each leaf prefix id."""
    events: list[RequestObserved] = []
    payloads: dict[int, list[Message]] = {}
    for _ in range(conversations):
        root, leaf = rng.getrandbits(62), rng.getrandbits(62)
        messages = conversation(rng)
        payloads[leaf] = messages
        payload = PrefixPayload(prefix_id=leaf, messages=messages)
        events += [
            request([root, leaf], tenant=tenant, payload=payload if i == 0 else None) for i in range(repeats)
        ]
    return events, payloads


def warmer_settings(
    kafka: KafkaSettings,
    engines: list[EmbeddedVllm],
    *,
    node: str,
    secrets: dict[str, str],
    warm: WarmSettings | None = None,
    readiness: ReadinessSettings | None = None,
) -> WarmerSettings:
    return WarmerSettings(
        kafka=kafka,
        node=node,
        engines=[engine_settings(engine, f"{node}-r{i}") for i, engine in enumerate(engines)],
        tenant_secrets={tenant: SecretStr(secret) for tenant, secret in secrets.items()},
        warm=warm or WarmSettings(health_interval_s=0.2, progress_interval_s=0.2, request_timeout_s=30),
        readiness=readiness or ReadinessSettings(plan_wait_s=600),
        http_host="127.0.0.1",
        http_port=0,
    )


async def real_chat(engine: EmbeddedVllm, messages: list[Message], cache_salt: str | None) -> dict[str, Any]:
    """A chat request as real traffic sends it (with the generation prompt, with no salt for None); its
    usage."""
    body: dict[str, Any] = {"model": engine.model_name, "messages": messages, "max_tokens": 1}
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    async with httpx.AsyncClient(base_url=engine.base_url, timeout=60.0) as http:
        response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    usage: dict[str, Any] = response.json()["usage"]
    return usage


async def ready_status(port: int, replica: str = "") -> int:
    """The status code of the warmer's `/ready` (or `/ready/<replica>`)."""
    return await status_code(port, f"/ready/{replica}" if replica else "/ready")


async def status_code(port: int, path: str) -> int:
    """The status code of GET `path` on the warmer listening on `port`."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5.0) as http:
        return (await http.get(path)).status_code


async def counted(dsn: str, expected: int) -> bool:
    """Whether the planner's statistics count `expected` requests in all."""
    db = await asyncpg.connect(dsn)
    try:
        total = await db.fetchval("SELECT coalesce(sum(requests), 0) FROM prefix_requests")
    finally:
        await db.close()
    return bool(total == expected)


async def full_blocks(engine: EmbeddedVllm, messages: list[Message]) -> int:
    """Tokens in the whole blocks of the warm rendering of `messages` (what a real request reuses)."""
    async with VllmEngineClient(
        engine.base_url, engine.model_name, connect_timeout_s=5, request_timeout_s=30, block_size=BLOCK_SIZE
    ) as client:
        tokens = await client.tokenize(PrefixPayload(prefix_id=0, messages=messages))
    return BLOCK_SIZE * (len(tokens) // BLOCK_SIZE)


async def wait_for(check: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    """Until `check()` is true; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)
