"""What an answered request tells the planner, whoever saw it (Warmplane's gateway, or the middleware inside a
vLLM server): its `request.observed` and, when its leading prefix was not resident, its `prefix.missed`. Pure:
no I/O, no clock (the caller stamps the time). Light: the event contract alone.

Contracts:
- One `RequestObserved` per request the engine answered with usage, carrying the prefix chain,
  `prompt_tokens` and `cached_tokens` from the engine's usage. Chain token counts are the chain's estimates
  scaled so the last one equals the engine's `prompt_tokens` (exact for token-id prompts, which need no
  scaling).
- A `PrefixMissed` too when the leading prefix was not resident: the engine found fewer cached tokens than
  the full blocks of the chain's first segment (vLLM caches only full blocks, and never the prompt's last
  token). A first segment shorter than a block cannot be resident and is never a miss.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from warmplane.shared.events import ModelRef, PrefixMissed, PrefixPayload, RequestObserved
from warmplane.shared.kv_blocks import cacheable_tokens
from warmplane.shared.prefix_chain import Namespace, PrefixChain, chat_chain, text_chain, token_chain


def usage_tokens(usage: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """(prompt tokens, cached tokens) from an OpenAI usage object, None if it has no prompt count."""
    if usage is None:
        return None
    prompt = usage.get("prompt_tokens")
    if not isinstance(prompt, int) or prompt < 0:
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return prompt, min(cached, prompt) if isinstance(cached, int) and cached > 0 else 0


def scaled_tokens(estimates: tuple[int, ...], prompt_tokens: int) -> list[int]:
    """Cumulative `estimates` rescaled so the last is `prompt_tokens` (non-decreasing, as events need)."""
    last = estimates[-1]
    if last <= 0 or last == prompt_tokens:
        return list(estimates)
    return [min(prompt_tokens, round(tokens * prompt_tokens / last)) for tokens in estimates]


def resident_depth(chain_tokens: list[int], prompt_tokens: int, cached: int, block_size: int) -> int:
    """How many leading chain elements were resident: their cacheable tokens were all found cached."""
    depth = 0
    for tokens in chain_tokens:
        if cacheable_tokens(tokens, prompt_tokens, block_size) > cached:
            break
        depth += 1
    return depth


def openai_chain(path_kind: str, body: Mapping[str, Any], namespace: Namespace) -> PrefixChain:
    """The prefix chain of an OpenAI request body: `chat` (its `messages`) or `completions` (its first
    `prompt`: text or token ids). Raises `ValueError`, `KeyError` or `TypeError` for a body without one."""
    if path_kind == "chat":
        return chat_chain(namespace, body["messages"])
    return _completions_chain(first_prompt(body["prompt"]), namespace)


def openai_payload(path_kind: str, body: Mapping[str, Any], prefix_id: int) -> PrefixPayload:
    """The replayable payload of the whole prompt of an OpenAI request body, as the catalog keeps it for
    `prefix_id` (`openai_chain`'s last id)."""
    if path_kind == "chat":
        return PrefixPayload(prefix_id=prefix_id, messages=list(body["messages"]))
    return PrefixPayload(prefix_id=prefix_id, prompt=first_prompt(body["prompt"]))


def first_prompt(prompt: Any) -> str | list[int]:
    """The (first) completions prompt: a batch's first, or the prompt itself."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        first: str | list[int] = prompt[0]
        return first
    if isinstance(prompt, str | list):
        return prompt
    raise TypeError("'prompt' is neither text nor token ids")


def _completions_chain(prompt: str | list[int], namespace: Namespace) -> PrefixChain:
    if isinstance(prompt, str):
        return text_chain(namespace, prompt)
    return token_chain(namespace, prompt)


class PayloadMemory:
    """The prefix ids whose payload was sent, at most `capacity` (least recently seen forgotten)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[int, None] = OrderedDict()

    def first_time(self, prefix_id: int) -> bool:
        """True if `prefix_id` is not remembered (it is from now on)."""
        if prefix_id in self._ids:
            self._ids.move_to_end(prefix_id)
            return False
        if self.capacity:
            self._ids[prefix_id] = None
            if len(self._ids) > self.capacity:
                self._ids.popitem(last=False)
        return True


@dataclass(frozen=True, slots=True)
class Observation:
    """One answered request, as its observer saw it."""

    tenant: str
    model: ModelRef
    epoch: int
    replica: str
    chain: PrefixChain
    prompt_tokens: int
    cached_tokens: int
    route: str = ""
    ttft_s: float | None = None
    payload: PrefixPayload | None = None
    """The whole prompt's payload for the catalog (for the chain's last id), when the observer sends it."""


def observed_events(
    seen: Observation,
    *,
    producer: str,
    block_size: int,
    at: datetime,
    new_id: Callable[[], uuid.UUID],
) -> tuple[RequestObserved, PrefixMissed | None]:
    """The request's `RequestObserved`, and its `PrefixMissed` when the leading prefix was not resident."""
    tokens = scaled_tokens(seen.chain.tokens, seen.prompt_tokens)
    common: dict[str, Any] = {
        "occurred_at": at,
        "producer": producer,
        "tenant": seen.tenant,
        "model": seen.model,
        "epoch": seen.epoch,
        "replica": seen.replica,
        "chain": list(seen.chain.ids),
        "chain_tokens": tokens,
    }
    observed = RequestObserved(
        event_id=new_id(),
        prompt_tokens=seen.prompt_tokens,
        cached_tokens=seen.cached_tokens,
        ttft_ms=None if seen.ttft_s is None else seen.ttft_s * 1000,
        route=seen.route,
        payload=seen.payload,
        **common,
    )
    if cacheable_tokens(tokens[0], seen.prompt_tokens, block_size) <= seen.cached_tokens:
        return observed, None
    depth = resident_depth(tokens, seen.prompt_tokens, seen.cached_tokens, block_size)
    missed = PrefixMissed(event_id=new_id(), resident_depth=depth, cached_tokens=seen.cached_tokens, **common)
    return observed, missed
