"""One behaviour suite for what the warmer needs of an engine (`vllm_client.EngineClient`), run against the
memory twin (`tests/unit/warmer/test_engine_client_memory.py`) and a real vLLM through `VllmEngineClient`
(`tests/integration/warmer/test_engine_client_vllm.py`). What the real engine does is the truth the twin
is held to.

Each behaviour draws fresh token ids, words and salts, so behaviours sharing one real engine never find
each other's cached blocks; and it knows nothing of the tokenizer beyond the ids a warm reports.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from warmplane.services.warmer.vllm_client import EngineClient, WarmFailed, WarmResult
from warmplane.shared.events import PrefixPayload
from warmplane.shared.kv_blocks import cacheable_tokens

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_IDLE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class EngineWorld:
    engine: EngineClient
    """A client of an engine that answers, its cache shared with nothing the behaviour does not send."""
    absent: EngineClient
    """A client of an engine that does not answer."""
    max_model_len: int


def _rng() -> random.Random:
    return random.Random(uuid.uuid4().int)


def _salt() -> str:
    return uuid.uuid4().hex


def _ids(rng: random.Random, count: int) -> list[int]:
    """Ordinary token ids of the tiny model's vocabulary (8,192), clear of its special tokens."""
    return [rng.randrange(100, 8000) for _ in range(count)]


def _words(rng: random.Random, count: int) -> str:
    return " ".join("".join(rng.choices(_LETTERS, k=rng.randint(2, 9))) for _ in range(count)) + "."


def _conversation(rng: random.Random, words_per_turn: int) -> list[dict[str, Any]]:
    roles = ("system", "user", "assistant")
    return [{"role": role, "content": _words(rng, words_per_turn)} for role in roles]


async def _warm(engine: EngineClient, salt: str, *, prompt: list[int] | str) -> WarmResult:
    return await engine.warm(PrefixPayload(1, prompt=prompt), cache_salt=salt)


async def a_first_warm_finds_nothing_and_its_repeat_every_whole_block_before_the_last_token(
    world: EngineWorld,
) -> None:
    engine, rng, salt = world.engine, _rng(), _salt()
    size = engine.block_size
    for length, expected in ((3 * size, 2 * size), (3 * size + 1, 3 * size)):
        prompt = _ids(rng, length)
        first = await _warm(engine, salt, prompt=prompt)
        assert (first.prompt_tokens, first.cached_tokens, first.prompt_token_ids) == (length, 0, prompt)
        again = await _warm(engine, salt, prompt=prompt)
        assert again.cached_tokens == engine.expected_cached_tokens(length) == expected


async def a_prompt_finds_the_whole_blocks_it_shares_with_a_warmed_one(world: EngineWorld) -> None:
    engine, rng, salt = world.engine, _rng(), _salt()
    size = engine.block_size
    warmed = _ids(rng, 3 * size)
    await _warm(engine, salt, prompt=warmed)
    longer = await _warm(engine, salt, prompt=warmed + _ids(rng, size // 2))
    assert longer.cached_tokens == 3 * size, "a warm caches its last whole block too"
    parted = await _warm(engine, salt, prompt=warmed[: size + size // 2] + _ids(rng, 2 * size))
    assert parted.cached_tokens == size, "a block shared in part is computed again"
    shorter = await _warm(engine, salt, prompt=warmed[: 2 * size])
    assert shorter.cached_tokens == size, "the block of the last token is computed again"


async def a_salt_keeps_its_blocks_from_other_salts_and_from_unsalted_traffic(world: EngineWorld) -> None:
    engine, rng, salt = world.engine, _rng(), _salt()
    prompt = _ids(rng, 2 * engine.block_size + 1)
    expected = engine.expected_cached_tokens(len(prompt))
    await _warm(engine, salt, prompt=prompt)
    assert (await _warm(engine, _salt(), prompt=prompt)).cached_tokens == 0
    assert (await _warm(engine, "", prompt=prompt)).cached_tokens == 0
    assert (await _warm(engine, "", prompt=prompt)).cached_tokens == expected, "unsalted warms unsalted"
    assert (await _warm(engine, salt, prompt=prompt)).cached_tokens == expected


async def a_chat_warm_renders_a_token_prefix_of_the_next_turn_and_warms_it(world: EngineWorld) -> None:
    engine, rng, salt = world.engine, _rng(), _salt()
    conversation = _conversation(rng, 3 * engine.block_size)
    turn = await engine.warm(PrefixPayload(1, messages=conversation), cache_salt=salt)
    following = [*conversation, {"role": "user", "content": _words(rng, engine.block_size)}]
    next_turn = await engine.warm(PrefixPayload(2, messages=following), cache_salt=salt)
    assert turn.prompt_token_ids is not None and next_turn.prompt_token_ids is not None
    assert len(turn.prompt_token_ids) == turn.prompt_tokens
    assert next_turn.prompt_token_ids[: turn.prompt_tokens] == turn.prompt_token_ids
    shared = cacheable_tokens(turn.prompt_tokens, next_turn.prompt_tokens, engine.block_size)
    assert next_turn.cached_tokens == shared > 0


async def the_token_ids_a_warm_reports_warm_the_same_blocks(world: EngineWorld) -> None:
    engine, rng, salt = world.engine, _rng(), _salt()
    text = PrefixPayload(1, prompt=_words(rng, 3 * engine.block_size))
    chat = PrefixPayload(2, messages=_conversation(rng, engine.block_size))
    for payload in (text, chat):
        rendered = (await engine.warm(payload, cache_salt=salt)).prompt_token_ids
        assert rendered is not None
        as_ids = await _warm(engine, salt, prompt=rendered)
        assert as_ids.cached_tokens == engine.expected_cached_tokens(len(rendered)) > 0


async def an_answering_engine_is_healthy_has_room_and_settles_to_nothing_in_flight(
    world: EngineWorld,
) -> None:
    engine = world.engine
    assert await engine.health() is True
    capacity = await engine.kv_capacity_tokens()
    assert capacity is not None and capacity > 0 and capacity % engine.block_size == 0
    await _warm(engine, _salt(), prompt=_ids(_rng(), engine.block_size + 1))
    deadline = time.monotonic() + _IDLE_TIMEOUT_S
    while (in_flight := await engine.requests_in_flight()) != 0:
        assert in_flight is not None, "an answering engine says how many requests it has"
        assert time.monotonic() < deadline, f"still {in_flight} in flight after {_IDLE_TIMEOUT_S} s"
        await asyncio.sleep(0.05)


async def an_engine_that_does_not_answer_is_unhealthy_of_unknown_state_and_fails_retryably(
    world: EngineWorld,
) -> None:
    engine = world.absent
    assert await engine.health() is False
    assert await engine.kv_capacity_tokens() is None
    assert await engine.requests_in_flight() is None
    with pytest.raises(WarmFailed) as failure:
        await _warm(engine, _salt(), prompt=_ids(_rng(), 40))
    assert failure.value.retryable


async def a_request_the_engine_refuses_fails_for_good(world: EngineWorld) -> None:
    engine, rng, limit = world.engine, _rng(), world.max_model_len
    with pytest.raises(WarmFailed) as bad_salt:
        await _warm(engine, "tenant/with-a-slash", prompt=_ids(rng, 40))
    assert "HTTP 400" in bad_salt.value.reason and "cache_salt" in bad_salt.value.reason
    with pytest.raises(WarmFailed) as too_long:
        await _warm(engine, _salt(), prompt=_ids(rng, limit + 1))
    assert "HTTP 400" in too_long.value.reason and str(limit) in too_long.value.reason
    refused = [bad_salt.value, too_long.value]
    assert not any(failure.retryable for failure in refused)
    assert not any("\n" in failure.reason for failure in refused), "a reason is one line"


async def a_warm_needs_room_in_the_context_for_the_token_it_asks_for(world: EngineWorld) -> None:
    engine, rng, limit = world.engine, _rng(), world.max_model_len
    with pytest.raises(WarmFailed) as full:
        await _warm(engine, _salt(), prompt=_ids(rng, limit))
    assert "HTTP 400" in full.value.reason and not full.value.retryable
    assert (await _warm(engine, _salt(), prompt=_ids(rng, limit - 1))).prompt_tokens == limit - 1


BEHAVIOURS: dict[str, Callable[[EngineWorld], Awaitable[None]]] = {
    behaviour.__name__: behaviour
    for behaviour in (
        a_first_warm_finds_nothing_and_its_repeat_every_whole_block_before_the_last_token,
        a_prompt_finds_the_whole_blocks_it_shares_with_a_warmed_one,
        a_salt_keeps_its_blocks_from_other_salts_and_from_unsalted_traffic,
        a_chat_warm_renders_a_token_prefix_of_the_next_turn_and_warms_it,
        the_token_ids_a_warm_reports_warm_the_same_blocks,
        an_answering_engine_is_healthy_has_room_and_settles_to_nothing_in_flight,
        an_engine_that_does_not_answer_is_unhealthy_of_unknown_state_and_fails_retryably,
        a_request_the_engine_refuses_fails_for_good,
        a_warm_needs_room_in_the_context_for_the_token_it_asks_for,
    )
}
