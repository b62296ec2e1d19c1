"""The proof the main job ends with: a warmed newcomer against a cold engine, in time to first token.

The requests are the trace's next ones (its tail, after the history the stack learned from) that routing
sends to the newcomer: its share of the ring at full weight, as the gateway hashes them (the chain
element at the routing depth), since a replica is warmed for the traffic it will be sent. Each is sent to
the warmed replica and to the cold engine directly, one at a time and streamed, in alternating order, with
the tenant's salt as the gateway would send it: the time to the first chunk is the engine's prefill, and
the usage says how much of the prompt its prefix cache served.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from warmplane.services.devstack.chat_load import Sample, closed_loop
from warmplane.services.devstack.chat_traffic import ChatRequest, routing_key
from warmplane.services.devstack.history import answer_tokens, messages
from warmplane.services.gateway.settings import RoutingSettings
from warmplane.shared.hash_ring import HashRing
from warmplane.shared.mooncake_trace import TraceRequest
from warmplane.shared.prefix_chain import Namespace, chat_chain

COMPARED = 12
"""Requests of the tail sent to both: enough for a median, short enough for a minute or two on the CPU."""


@dataclass(frozen=True, slots=True)
class Side:
    """What one engine did with the compared requests."""

    ttfts_s: list[float]
    prompt_tokens: int
    cached_tokens: int

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Side:
        failed = [s for s in samples if s.status != 200 or s.ttft is None]
        if failed:
            raise RuntimeError(f"a compared request failed: {failed[0].status} {failed[0].error}")
        return cls(
            [s.ttft for s in samples if s.ttft is not None],
            sum(s.prompt_tokens for s in samples),
            sum(s.cached_tokens for s in samples),
        )

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.ttfts_s) * 1000

    @property
    def p90_ms(self) -> float:
        return statistics.quantiles(self.ttfts_s, n=10, method="inclusive")[-1] * 1000

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / max(self.prompt_tokens, 1)


def routed_to(
    tail: Sequence[TraceRequest],
    words: Sequence[str],
    *,
    replica: str,
    replicas: Sequence[str],
    routing: RoutingSettings,
    tenant: str,
    model: str,
    count: int = COMPARED,
) -> list[ChatRequest]:
    """The first `count` requests of `tail` that the full-weight ring over `replicas` gives `replica`."""
    ring = HashRing(dict.fromkeys(replicas, 1.0), vnodes=routing.vnodes, load_factor=routing.load_factor)
    chosen = []
    for request in tail:
        shown = messages(request, words)
        ids = chat_chain(Namespace(tenant, model), shown).ids
        if ring.owner(ids[min(routing.depth, len(ids) - 1)]) == replica:
            chosen.append(ChatRequest(0.0, shown, answer_tokens(request), routing_key(request)))
            if len(chosen) == count:
                break
    return chosen


async def compare(
    requests: Sequence[ChatRequest], warmed_url: str, cold_url: str, *, model: str, salt: str
) -> tuple[Side, Side]:
    """Send each request to both engines, alternating which goes first; (warmed, cold). Only the first
    chunk is asked for: a one-token answer."""
    body = {"cache_salt": salt}
    warmed: list[Sample] = []
    cold: list[Sample] = []
    for index, request in enumerate(requests):
        one = [ChatRequest(0.0, request.messages, 1, request.key)]
        order = [(warmed_url, warmed), (cold_url, cold)]
        for url, side in order if index % 2 == 0 else order[::-1]:
            side.extend(await closed_loop(url, one, model=model, extra_body=body))
    return Side.of(warmed), Side.of(cold)


def show(warmed: Side, cold: Side, replica: str, out: TextIO) -> None:
    out.write(
        f"the trace's next {len(warmed.ttfts_s)} requests that routing sends to {replica}, each sent to "
        f"{replica} and to a cold engine\nof the same model (one at a time, streamed):\n"
        f"  {'':<22} {'TTFT p50':>9} {'p90':>9}   prompt tokens served from the prefix cache\n"
        f"  {replica + ' (warmed)':<22} {warmed.p50_ms:>6.0f} ms {warmed.p90_ms:>6.0f} ms"
        f"   {warmed.cached_share:.1%}\n"
        f"  {'cold engine':<22} {cold.p50_ms:>6.0f} ms {cold.p90_ms:>6.0f} ms   {cold.cached_share:.1%}\n"
        f"  warmed / cold, TTFT p50: {warmed.p50_ms / cold.p50_ms:.2f}\n"
    )
