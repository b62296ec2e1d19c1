"""Recorded request traces in the Mooncake JSONL format, as request events.

One JSON object a line: `timestamp` (ms from the start), `input_length`, `output_length` (tokens) and
`hash_ids`: one id per block of `block_tokens` (512 in the published traces), each standing for its
block and every block before it, so a request's ids are a prefix chain. The last block may be partial.

The traces hold no text. To replay one against a real engine, `warmplane.services.devstack.chat_traffic`
stands a chat message of words in for each block: two requests sharing their first k hash ids share their
first k messages, and nothing else, as their real prompts did. Events may also shrink blocks
(`block_tokens` below the trace's 512); token counts scale with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import msgspec

from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, PrefixPayload, RequestObserved

TRACE_BLOCK_TOKENS = 512
"""Tokens a hash id stands for in the published traces."""


class TraceRequest(msgspec.Struct, frozen=True):
    timestamp: int
    input_length: int
    output_length: int
    hash_ids: list[int]


def read_trace(path: Path, limit: int | None = None, *, ordered: bool = False) -> Iterator[TraceRequest]:
    """The requests of the trace at `path`, in file order (requests without hash ids left out); raises
    `ValueError` naming a line that is not a request, or with `ordered`, one whose timestamp is earlier than
    the line before it (a replay in real time needs the trace in time order)."""
    decoder = msgspec.json.Decoder(TraceRequest)
    latest = None
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if limit is not None and number > limit:
                return
            if not line.strip():
                continue
            try:
                request = decoder.decode(line)
            except msgspec.DecodeError as exc:
                raise ValueError(f"{path}:{number}: not a Mooncake trace line: {exc}") from None
            if ordered and latest is not None and request.timestamp < latest:
                raise ValueError(
                    f"{path}:{number}: timestamp {request.timestamp} is earlier than the line before "
                    f"({latest}); the replay needs the trace in time order"
                )
            latest = request.timestamp
            if request.hash_ids:
                yield request


def cumulative_tokens(
    request: TraceRequest, block_tokens: int, trace_block_tokens: int = TRACE_BLOCK_TOKENS
) -> list[int]:
    """Tokens up to each block of the chain; the last block holds what remains of the input. The input
    is scaled by `block_tokens / trace_block_tokens`: a replay with blocks smaller than the published
    traces' 512 shrinks lengths with them, and a trace recorded with `block_tokens` (Warmplane's own
    exports) is taken as it is."""
    input_tokens = max(request.input_length * block_tokens // trace_block_tokens, 1)
    return [min(block_tokens * (i + 1), input_tokens) for i in range(len(request.hash_ids))]


def request_event(
    request: TraceRequest,
    *,
    start: datetime,
    tenant: str,
    model: ModelRef,
    replica: str,
    block_tokens: int = TRACE_BLOCK_TOKENS,
    producer: str = "trace-replay",
    payload: PrefixPayload | None = None,
) -> RequestObserved:
    """The request-observed event of one trace request, as a serving node would have emitted it;
    `payload` renders one element of its chain, for the prefix catalog."""
    tokens = cumulative_tokens(request, block_tokens)
    return RequestObserved(
        event_id=new_event_id(),
        occurred_at=start + timedelta(milliseconds=request.timestamp),
        producer=producer,
        tenant=tenant,
        model=model,
        replica=replica,
        route="trace",
        chain=request.hash_ids,
        chain_tokens=tokens,
        prompt_tokens=max(request.input_length * block_tokens // TRACE_BLOCK_TOKENS, tokens[-1]),
        payload=payload,
    )
