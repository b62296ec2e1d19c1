"""An in-memory twin of a vLLM engine as the warmer sees it through `EngineClient` (no sockets).
`tests/engine_client_behaviour.py` holds it to what the real engine does.

What it models of vLLM (0.32, prefix caching on): each cache salt, and unsalted traffic (``""``), has a
cache of its own; a request finds the leading whole blocks of its prompt already cached under its salt,
never the block holding its last token (always recomputed), and then caches every whole block of its
prompt. Text and chat payloads go through a toy tokenizer, one token per word, rendered as the tiny
model's template does: a BOS, then ``<|im_start|>role content <|im_end|>`` per message. Requests the
engine refuses (a salt vLLM rejects, a prompt that leaves no room in the context for the one token a
warm asks for) fail for good. It never evicts by itself: `evict` stands for the memory pressure that
would.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from warmplane.services.warmer.vllm_client import WARM_PRIORITY, WarmFailed, WarmResult
from warmplane.shared.events import PrefixPayload
from warmplane.shared.kv_blocks import DEFAULT_BLOCK_SIZE, cacheable_tokens, reusable_blocks

BOS: Final = 0
IM_START: Final = 2
IM_END: Final = 3
_FIRST_WORD: Final = 100
#: vLLM's `validate_cache_salt`: at most 128 characters, none of these.
_SALT_FORBIDDEN: Final = frozenset("@/\\\x00")
_SALT_MAX_CHARS: Final = 128


@dataclass(frozen=True, slots=True)
class Sent:
    """One warm request the engine was sent, answered or not."""

    payload: PrefixPayload
    cache_salt: str
    priority: int


class MemoryEngine:
    """One engine of `num_blocks` KV blocks of `block_size` tokens, `max_model_len` tokens of context; it
    answers while `answering` (otherwise health is false, the gauges unknown and every warm fails as a
    refused connection does: retryably)."""

    def __init__(
        self,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        num_blocks: int = 2048,
        max_model_len: int = 4096,
        answering: bool = True,
    ) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len
        self.answering = answering
        self.cached: defaultdict[str, set[tuple[int, ...]]] = defaultdict(set)
        """Per salt, the prompt prefixes (whole blocks) whose last block is cached."""
        self.requests: list[Sent] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self.on_warm: Callable[[Sent], Awaitable[None]] | None = None
        """Awaited as each warm request arrives, before it is answered (a test's hook)."""
        self._vocabulary: dict[str, int] = {}
        self._scripted: defaultdict[tuple[int, ...], deque[WarmFailed]] = defaultdict(deque)

    def expected_cached_tokens(self, prompt_tokens: int) -> int:
        return cacheable_tokens(prompt_tokens, prompt_tokens, self.block_size)

    async def health(self) -> bool:
        return self.answering

    async def kv_capacity_tokens(self) -> int | None:
        """As vLLM reports it: its blocks less the one it keeps back, in tokens."""
        return (self.num_blocks - 1) * self.block_size if self.answering else None

    async def requests_in_flight(self) -> int | None:
        return self.in_flight if self.answering else None

    async def warm(
        self, payload: PrefixPayload, *, cache_salt: str, priority: int = WARM_PRIORITY
    ) -> WarmResult:
        """Prefill `payload` under `cache_salt`; raises `WarmFailed` as the real client does."""
        self.requests.append(sent := Sent(payload, cache_salt, priority))
        if self.on_warm is not None:
            await self.on_warm(sent)
        path = "/v1/chat/completions" if payload.messages is not None else "/v1/completions"
        if not self.answering:
            raise WarmFailed(f"POST {path}: ConnectError at the memory engine", retryable=True)
        started = time.perf_counter()
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)  # a real engine overlaps requests: let the others in while this one runs
            tokens = self.render(payload)
            if self._scripted[tuple(tokens)]:
                raise self._scripted[tuple(tokens)].popleft()
            self._refuse(path, tokens, cache_salt)
            cached = self._prefill(tokens, cache_salt)
        finally:
            self.in_flight -= 1
        return WarmResult(len(tokens), cached, time.perf_counter() - started, tokens)

    def render(self, payload: PrefixPayload) -> list[int]:
        """The token ids the engine computes `payload` as: token ids as they are, text after a BOS."""
        if payload.messages is not None:
            rendered = [BOS]
            for message in payload.messages:
                rendered += [IM_START, *self._words(f"{message['role']} {message['content']}"), IM_END]
            return rendered
        if isinstance(payload.prompt, str):
            return [BOS, *self._words(payload.prompt)]
        return list(payload.prompt or [])

    def script(self, prompt: list[int], *failures: WarmFailed) -> None:
        """Fail the next requests for exactly `prompt` with `failures`, in turn, before answering again."""
        self._scripted[tuple(prompt)].extend(failures)

    def sent(self, prompt: list[int]) -> int:
        """How many requests carried exactly the token ids `prompt`."""
        return sum(request.payload.prompt == prompt for request in self.requests)

    def evict(self, prompt: list[int], *, keep_blocks: int = 0) -> None:
        """Drop the blocks of `prompt` after its first `keep_blocks`, under every salt."""
        size = self.block_size
        dropped = {tuple(prompt[: k * size]) for k in range(keep_blocks + 1, len(prompt) // size + 1)}
        for prefixes in self.cached.values():
            prefixes.difference_update(dropped)

    def _words(self, text: str) -> list[int]:
        return [
            self._vocabulary.setdefault(word, _FIRST_WORD + len(self._vocabulary)) for word in text.split()
        ]

    def _refuse(self, path: str, tokens: list[int], cache_salt: str) -> None:
        """Raise what vLLM answers HTTP 400 for (its messages, abridged)."""
        if len(cache_salt) > _SALT_MAX_CHARS or _SALT_FORBIDDEN.intersection(cache_salt):
            reason = "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/'"
            raise WarmFailed(f"POST {path}: HTTP 400: {reason}")
        if len(tokens) > self.max_model_len:
            reason = f"This model's maximum context length is {self.max_model_len} tokens"
            raise WarmFailed(f"POST {path}: HTTP 400: {reason}; your prompt contains {len(tokens)}")
        if len(tokens) == self.max_model_len:  # no room left for the one token a warm asks for
            raise WarmFailed(f"POST {path}: HTTP 400: max_tokens must be at least 1, got 0.")

    def _prefill(self, tokens: list[int], cache_salt: str) -> int:
        """Cached tokens found for `tokens` under `cache_salt`; caches its whole blocks."""
        prefixes, size = self.cached[cache_salt], self.block_size
        found = 0
        while found < reusable_blocks(len(tokens), size) and tuple(tokens[: (found + 1) * size]) in prefixes:
            found += 1
        prefixes.update(tuple(tokens[: k * size]) for k in range(1, len(tokens) // size + 1))
        return found * size
