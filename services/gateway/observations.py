"""What an answered request tells the planner: `request.observed`, `prefix.missed`, and its metrics.

Contracts:
- One `RequestObserved` per request the replica answered with usage (status 200), carrying the prefix
  chain, `prompt_tokens` and `cached_tokens` from the engine's usage, TTFT measured at the first byte
  the client was sent (streaming only), the replica, tenant, model and epoch. Chain token counts are
  the chain's estimates scaled so the last one equals the engine's `prompt_tokens` (exact for token-id
  prompts, which need no scaling).
- A `PrefixMissed` too when the leading prefix was not resident: the engine found fewer cached tokens
  than the full blocks of the chain's first segment (vLLM caches only full blocks, and never the
  prompt's last token). A first segment shorter than a block cannot be resident and is never a miss.
- A catalog payload (the whole prompt, for the chain's last id) goes only with the first request this
  instance sees for that id, within a bounded memory of ids (oldest forgotten first).
- Emitting never blocks: an event the emitter refuses is counted and forgotten.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from warmplane.services.gateway.metrics import GatewayMetrics
from warmplane.services.gateway.openai_request import ClientRequest, payload_of
from warmplane.shared.events import Event, ModelRef, PrefixMissed, RequestObserved
from warmplane.shared.prefix_chain import PrefixChain


class EventSink(Protocol):
    """Where events go: `warmplane.shared.emitter.Emitter` in production, a list in unit tests."""

    def emit(self, event: Event) -> bool: ...


@dataclass(frozen=True, slots=True)
class Served:
    """One request a replica answered with 200."""

    request: ClientRequest
    chain: PrefixChain
    tenant: str
    epoch: int
    replica: str
    revision: str
    route: str
    usage: Mapping[str, Any] | None
    ttft_s: float | None


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


def cacheable(tokens: int, prompt_tokens: int, block_size: int) -> int:
    """The tokens of a prefix of `tokens` the engine can hold: its full blocks, never the last token."""
    return block_size * (min(tokens, prompt_tokens - 1) // block_size)


def resident_depth(chain_tokens: list[int], prompt_tokens: int, cached: int, block_size: int) -> int:
    """How many leading chain elements were resident: their cacheable tokens were all found cached."""
    depth = 0
    for tokens in chain_tokens:
        if cacheable(tokens, prompt_tokens, block_size) > cached:
            break
        depth += 1
    return depth


class Observer:
    """Turns `Served` requests into events (through `sink`) and token metrics."""

    def __init__(
        self,
        sink: EventSink,
        metrics: GatewayMetrics,
        *,
        producer: str,
        block_size: int,
        payload_memory: int,
        new_id: Callable[[], uuid.UUID],
        clock: Callable[[], datetime],
    ) -> None:
        self._sink = sink
        self._metrics = metrics
        self._producer = producer
        self._block_size = block_size
        self._payloads = PayloadMemory(payload_memory)
        self._new_id = new_id
        self._clock = clock

    def served(self, served: Served) -> None:
        counts = usage_tokens(served.usage)
        if counts is None:
            return
        prompt_tokens, cached = counts
        request, chain = served.request, served.chain
        metrics = self._metrics.pair(served.tenant, request.model)
        metrics.prompt_tokens.inc(prompt_tokens)
        metrics.cached_tokens.inc(cached)
        if prompt_tokens:
            metrics.cached_ratio.observe(cached / prompt_tokens)
        tokens = scaled_tokens(chain.tokens, prompt_tokens)
        leaf = chain.ids[-1]
        payload = payload_of(request, leaf) if self._payloads.first_time(leaf) else None
        common: dict[str, Any] = {
            "occurred_at": self._clock(),
            "producer": self._producer,
            "tenant": served.tenant,
            "model": ModelRef(request.model, served.revision),
            "epoch": served.epoch,
            "replica": served.replica,
            "chain": list(chain.ids),
            "chain_tokens": tokens,
        }
        ttft_ms = None if served.ttft_s is None else served.ttft_s * 1000
        self._emit(
            RequestObserved(
                event_id=self._new_id(),
                prompt_tokens=prompt_tokens,
                cached_tokens=cached,
                ttft_ms=ttft_ms,
                route=served.route,
                payload=payload,
                **common,
            )
        )
        if cacheable(tokens[0], prompt_tokens, self._block_size) > cached:
            metrics.cold.inc()
            depth = resident_depth(tokens, prompt_tokens, cached, self._block_size)
            self._emit(
                PrefixMissed(event_id=self._new_id(), resident_depth=depth, cached_tokens=cached, **common)
            )

    def _emit(self, event: Event) -> None:
        if not self._sink.emit(event):
            self._metrics.events_dropped.inc()
