"""`warmplane replay TRACE`: publish a recorded trace (Mooncake JSONL) as request events, as a serving
fleet would have, so the planner learns from it and the API shows what warming would buy.

Events are stamped so the trace ends now (its own spacing kept), spread over `replicas` stand-in
replica names by the chain's second element, and sent through the emitter SDK. The replay paces itself
on the emitter's buffer (the emitter never blocks serving; a replay has nothing better to do than
wait), shows emitted / acknowledged progress, and exits 0 only when every event was sent.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TextIO

from warmplane.services.cli.progress import Progress
from warmplane.shared.emitter import Emitter
from warmplane.shared.events import Event, ModelRef
from warmplane.shared.mooncake_trace import TRACE_BLOCK_TOKENS, read_trace, request_event
from warmplane.shared.settings import EmitterSettings, KafkaSettings
from warmplane.shared.topics import Topics

DRAIN_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    trace: Path
    tenant: str
    model: ModelRef
    limit: int | None = None
    block_tokens: int = TRACE_BLOCK_TOKENS
    replicas: int = 4


async def emit_paced(emitter: Emitter, event: Event) -> None:
    """Emit `event`, retrying while the buffer is full. The emitter never blocks its caller (serving
    must not wait on Kafka); a replay paces itself instead, as the sender drains the buffer."""
    while not emitter.emit(event):  # noqa: ASYNC110 - the emitter offers no event to wait on, by design
        await asyncio.sleep(0.01)


async def replay(options: ReplayOptions, kafka: KafkaSettings, out: TextIO) -> int:
    """Publish the trace's requests; 0 when all were acknowledged, 1 otherwise (the count is printed).
    Raises `FileNotFoundError` for a missing trace."""
    if not options.trace.is_file():
        raise FileNotFoundError(f"no trace at {options.trace}")
    requests = list(read_trace(options.trace, options.limit))
    start = datetime.now(UTC) - timedelta(milliseconds=requests[-1].timestamp if requests else 0)
    progress = Progress(out, total=len(requests), label="emitted / acknowledged")
    async with Emitter(kafka, EmitterSettings(), Topics(kafka.topic_prefix)) as emitter:
        for index, request in enumerate(requests):
            replica = f"replay-{request.hash_ids[min(1, len(request.hash_ids) - 1)] % options.replicas}"
            event = request_event(
                request,
                start=start,
                tenant=options.tenant,
                model=options.model,
                replica=replica,
                block_tokens=options.block_tokens,
            )
            await emit_paced(emitter, event)
            if index % 1_000 == 0:
                progress.show(index, emitter.stats.sent)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while (stats := emitter.stats).buffered and time.monotonic() < deadline:
            progress.show(len(requests), stats.sent)
            await asyncio.sleep(0.1)
    stats = emitter.stats
    progress.show(len(requests), stats.sent, final=True)
    dropped = sum(stats.dropped.values())
    out.write(
        f"{stats.sent:,} request events sent to {Topics(kafka.topic_prefix).requests}, {dropped:,} dropped\n"
    )
    return 0 if stats.sent == len(requests) else 1
