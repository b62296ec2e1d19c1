"""What an answered request tells the planner: `request.observed`, `prefix.missed`, and its metrics.

Contracts:
- The events are `shared/request_events.py`'s, for each request the replica answered with usage (status
  200), with TTFT measured at the first byte the client was sent (streaming only).
- A catalog payload (the whole prompt, for the chain's last id) goes only with the first request this
  instance sees for that id, within a bounded memory of ids (oldest forgotten first).
- Emitting never blocks: an event the emitter refuses is counted and forgotten.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from warmplane.services.gateway.metrics import GatewayMetrics
from warmplane.services.gateway.openai_request import ClientRequest, payload_of
from warmplane.shared.events import Event, ModelRef
from warmplane.shared.prefix_chain import PrefixChain
from warmplane.shared.request_events import Observation, PayloadMemory, observed_events, usage_tokens


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
        leaf = chain.ids[-1]
        seen = Observation(
            tenant=served.tenant,
            model=ModelRef(request.model, served.revision),
            epoch=served.epoch,
            replica=served.replica,
            chain=chain,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            route=served.route,
            ttft_s=served.ttft_s,
            payload=payload_of(request, leaf) if self._payloads.first_time(leaf) else None,
        )
        observed, missed = observed_events(
            seen, producer=self._producer, block_size=self._block_size, at=self._clock(), new_id=self._new_id
        )
        self._emit(observed)
        if missed is not None:
            metrics.cold.inc()
            self._emit(missed)

    def _emit(self, event: Event) -> None:
        if not self._sink.emit(event):
            self._metrics.events_dropped.inc()
