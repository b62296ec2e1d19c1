"""What the development stack learns from before a replica joins: a recorded trace's history.

The history is the trace's first requests. Its older part is published as the request events serving
nodes would have published (no engine answered them, so they carry no cache figures); a share of its last
minute's conversations is sent as real chat traffic through the gateway to the first replica, for as long
as that minute lasts, so the planner also learns from the events the gateway publishes with vLLM's own
usage figures, as in production. Both render a trace request the same way (`chat_traffic`): one message
per trace block, so an event's chain is exactly the chain the gateway computes for the same request, and
the planner sees one catalogue. The requests after the history are the tail: what the fleet is asked next.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from warmplane.services.cli.replay import emit_paced
from warmplane.services.devstack import chat_traffic
from warmplane.services.devstack.chat_load import Sample, within
from warmplane.services.devstack.chat_traffic import ChatRequest, Slice, chat_messages, kept, routing_key
from warmplane.shared.emitter import Emitter
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, PrefixPayload, RequestObserved
from warmplane.shared.mooncake_trace import TraceRequest
from warmplane.shared.prefix_chain import Namespace, chat_chain

LIVE_S = 60.0
"""The history's last minute (on the trace's clock) is sent as real traffic."""
LIVE_SHARE = 0.25
"""The share of that minute's conversations sent: the trace's full rate is more than one CPU engine
prefills (about 200 requests a minute of some 1,000 tokens each)."""
LIVE_CONCURRENCY = 2
"""Live requests in flight: a closed loop, sized to what the engine serves in `LIVE_S`, not to the
trace's rate (an open loop at that rate queued for minutes on a busy 2-core machine)."""
PAYLOAD_DEPTHS = (4, 8, 16, 24)
"""Chain elements whose payloads the recorded events carry (the first time each is seen): what a plan
can warm. The gateway sends the whole prompt's instead, once per prompt."""
SHAPE = Slice(offset_s=0.0, duration_s=0.0, sample=LIVE_SHARE, max_blocks=24, max_tokens_cap=16)
"""How a trace request becomes a chat request (words per block, answer length), its chain cut at 24 blocks
(about 1,000 tokens), so a cold prefill on one CPU core stays within seconds."""


@dataclass(frozen=True, slots=True)
class History:
    recorded: list[TraceRequest]
    """Published as events."""
    live: list[ChatRequest]
    """Sent through the gateway, in order (their times are the trace's, unused)."""
    tail: list[TraceRequest]
    """After the history, in trace order."""


def split_history(trace: Sequence[TraceRequest], size: int, words: Sequence[str]) -> History:
    """The first `size` requests of `trace` as history (its last `LIVE_S` seconds live, `LIVE_SHARE` of
    their conversations), and the rest as the tail."""
    history, tail = list(trace[:size]), list(trace[size:])
    live_from = history[-1].timestamp - LIVE_S * 1000 if history else 0
    recorded = [r for r in history if r.timestamp < live_from]
    live = [
        ChatRequest(
            at_s=(request.timestamp - live_from) / 1000,
            messages=messages(request, words),
            max_tokens=answer_tokens(request),
            key=routing_key(request),
        )
        for request in history
        if request.timestamp >= live_from and kept(routing_key(request), SHAPE.sample, SHAPE.seed)
    ]
    return History(recorded, live, tail)


def messages(request: TraceRequest, words: Sequence[str]) -> list[dict[str, str]]:
    return chat_messages(request.hash_ids[: SHAPE.max_blocks], words, SHAPE.words_per_block)


def answer_tokens(request: TraceRequest) -> int:
    return chat_traffic.answer_tokens(request, SHAPE)


def recorded_event(
    request: TraceRequest,
    words: Sequence[str],
    *,
    start: datetime,
    tenant: str,
    model: str,
    catalogued: set[int],
) -> RequestObserved:
    """The request event a serving node would have published for `request` at `start` + its time, with
    the payload of one chain element the first time that element is seen (`PAYLOAD_DEPTHS`)."""
    shown = messages(request, words)
    chain = chat_chain(Namespace(tenant, model), shown)
    payload = None
    for depth in reversed(PAYLOAD_DEPTHS):
        if len(chain.ids) >= depth and chain.ids[depth - 1] not in catalogued:
            catalogued.add(chain.ids[depth - 1])
            payload = PrefixPayload(prefix_id=chain.ids[depth - 1], messages=shown[:depth])
            break
    return RequestObserved(
        event_id=new_event_id(),
        occurred_at=start + timedelta(milliseconds=request.timestamp),
        producer="trace-replay",
        tenant=tenant,
        model=ModelRef(model),
        replica=f"recorded-{routing_key(request) % 4}",
        route="trace",
        chain=list(chain.ids),
        chain_tokens=list(chain.tokens),
        prompt_tokens=chain.tokens[-1],
        payload=payload,
    )


async def publish_recorded(
    requests: Sequence[TraceRequest],
    words: Sequence[str],
    emitter: Emitter,
    *,
    tenant: str,
    model: str,
    ends_at: datetime | None = None,
) -> int:
    """Publish `requests` as events, their trace times shifted so the last is `ends_at` (now); how many."""
    if not requests:
        return 0
    start = (ends_at or datetime.now(UTC)) - timedelta(milliseconds=requests[-1].timestamp)
    catalogued: set[int] = set()
    for index, request in enumerate(requests):
        event = recorded_event(request, words, start=start, tenant=tenant, model=model, catalogued=catalogued)
        await emit_paced(emitter, event)
        if index % 500 == 0:
            await asyncio.sleep(0)  # rendering is CPU work: let the stack's other tasks run
    return len(requests)


async def send_live(gateway_url: str, api_key: str, live: Sequence[ChatRequest], model: str) -> list[Sample]:
    """Send `live` through the gateway in order, `LIVE_CONCURRENCY` at a time, for at most `LIVE_S`: on a
    slower machine fewer are sent rather than queued. The samples, in the order they were sent."""
    headers = {"Authorization": f"Bearer {api_key}"}
    return await within(
        gateway_url, live, model=model, headers=headers, concurrency=LIVE_CONCURRENCY, budget_s=LIVE_S
    )
