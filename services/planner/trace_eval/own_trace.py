"""Warmplane's own request events as a Mooncake trace: the inverse of `shared/mooncake_trace.py`. Pure: no
I/O, no clock (an import contract keeps it so); `request_topic.py` reads the events.

A request event carries its prefix chain (`chain`: chained ids of message boundaries and chunks) and the
cumulative tokens up to each element (`chain_tokens`). A Mooncake trace carries one chained id per block
of `block_tokens` tokens. The mapping lays blocks over the chain's tokens as vLLM lays them over a prompt:
block k covers tokens [k·B, (k+1)·B), wherever message boundaries fall. A block's id is derived from the
chain element holding its last token and its index among the blocks ending in that element: the element's
id itself for the first (so a chain cut every B tokens, as a replayed Mooncake trace is, maps to its own
ids), a 64-bit BLAKE2b of (element id, index) for the others. Everything before a block's end is fixed by
that element (ids are chained), so requests that share a chain prefix share the ids of every block that
ends inside it, and nothing else, exactly as Mooncake's hash ids behave. Derived ids are signed 64-bit
like prefix ids; a collision with another id is as likely as one between two prefix ids.

Token counts: the gateway scales its chain estimates to each request's engine `prompt_tokens`, so one
element can carry slightly different counts in two requests, which would shift block boundaries and
break the sharing above. `canonical_tokens` therefore fixes each element's cumulative count at its first
sighting (in arrival order) and builds later requests' counts from it: a request's block layout is a
function of its chain alone. Producers that count exactly (token-id prompts, a replayed trace) are
unchanged by it.

Partial blocks: vLLM caches only full blocks, so by default (`drop`) a request's trailing tokens short of
a block are in its `input_length` but in no block, and a request shorter than one block has no block and
is left out of the trace. `keep` gives them a last, partial block, as Mooncake's published traces do
(their last hash id is partial); it reproduces a replayed Mooncake trace exactly, and overstates what a
repeat can hit by less than one block per request.

The trace's `input_length` is the chain's (canonical) token count, which the blocks cover; `prompt_tokens`
may exceed it by the chat template's tail. `output_length` is 0: request events carry no output length.
`timestamp` is milliseconds since the first selected request.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

from warmplane.shared.events import RequestObserved
from warmplane.shared.mooncake_trace import TraceRequest

PartialBlocks = Literal["drop", "keep"]
_MS: Final = timedelta(milliseconds=1)
_ID_BYTES: Final = 8


@dataclass(frozen=True, slots=True)
class TrafficFilter:
    """Which requests to export: one tenant and model name (and weights revision, if given), arrived in
    [since, until) (either open when None; aware datetimes)."""

    tenant: str
    model: str
    revision: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def admits(self, event: RequestObserved) -> bool:
        return (
            event.tenant == self.tenant
            and event.model.name == self.model
            and (self.revision is None or event.model.revision == self.revision)
            and (self.since is None or event.occurred_at >= self.since)
            and (self.until is None or event.occurred_at < self.until)
        )


def select(events: Iterable[RequestObserved], traffic: TrafficFilter) -> list[RequestObserved]:
    """The events `traffic` admits, in arrival order (`occurred_at`; a stable sort, so events of equal
    time keep the order they were given in: `request_topic` gives (partition, offset) order, which for
    one partition is the order they were sent, and across partitions is arbitrary but fixed)."""
    return sorted((event for event in events if traffic.admits(event)), key=lambda event: event.occurred_at)


def canonical_tokens(requests: Sequence[RequestObserved]) -> list[tuple[int, ...]]:
    """Each request's cumulative tokens per chain element, every element's count fixed at its first
    sighting in `requests` (see the module's note). Each tuple is as long as its chain and non-decreasing;
    an element's count is the same in every request that carries it, as long as each element is first
    seen after its parent (always so for chained ids)."""
    fixed: dict[int, int] = {}
    result: list[tuple[int, ...]] = []
    for request in requests:
        cumulative: list[int] = []
        before, own_before = 0, 0
        for element, tokens in zip(request.chain, request.chain_tokens, strict=True):
            known = fixed.get(element)
            if known is None:
                known = before + max(0, tokens - own_before)
                fixed[element] = known
            before, own_before = max(before, known), tokens
            cumulative.append(before)
        result.append(tuple(cumulative))
    return result


def derived_block_id(element: int, index: int) -> int:
    """The id of the `index`-th block ending in chain element `element`: the element's id for the first,
    a signed 64-bit hash of both for the others. Deterministic across processes."""
    if index == 0:
        return element
    data = element.to_bytes(_ID_BYTES, "big", signed=True) + index.to_bytes(_ID_BYTES, "big")
    return int.from_bytes(hashlib.blake2b(data, digest_size=_ID_BYTES).digest(), "big", signed=True)


def chain_blocks(
    chain: Sequence[int], cumulative: Sequence[int], block_tokens: int, partial: PartialBlocks = "drop"
) -> list[int]:
    """The block ids of a chain with `cumulative` tokens per element: `cumulative[-1] // block_tokens`
    of them, plus one partial block when `partial` is `keep` and tokens remain. Raises `ValueError` for a
    block size that is not positive or lengths that differ."""
    if block_tokens <= 0:
        raise ValueError("block_tokens must be positive")
    if len(chain) != len(cumulative) or not chain:
        raise ValueError("a chain needs one cumulative count per element, and at least one element")
    total = cumulative[-1]
    ends = [block_tokens * (k + 1) for k in range(total // block_tokens)]
    if partial == "keep" and total % block_tokens:
        ends.append(total)
    blocks = []
    for k, end in enumerate(ends):
        element = bisect_left(cumulative, end)  # the first element whose tokens reach the block's end
        first = cumulative[element - 1] // block_tokens if element else 0
        blocks.append(derived_block_id(chain[element], k - first))
    return blocks


@dataclass(frozen=True, slots=True)
class OwnTrace:
    """An export: the trace's records (one per selected request with at least one block, in arrival
    order), each record's request, the first request's time (the trace's zero) and how many requests had
    no block (shorter than one block under `drop`)."""

    records: list[TraceRequest]
    sources: list[RequestObserved]
    start: datetime | None
    blockless: int


def to_trace(
    requests: Sequence[RequestObserved], block_tokens: int, partial: PartialBlocks = "drop"
) -> OwnTrace:
    """`requests` (selected: one tenant and model, in arrival order) as Mooncake records of
    `block_tokens`-token blocks. Raises `ValueError` for a block size that is not positive."""
    if not requests:
        return OwnTrace([], [], None, 0)
    start = requests[0].occurred_at
    records: list[TraceRequest] = []
    sources: list[RequestObserved] = []
    for request, cumulative in zip(requests, canonical_tokens(requests), strict=True):
        blocks = chain_blocks(request.chain, cumulative, block_tokens, partial)
        if not blocks:
            continue
        records.append(TraceRequest((request.occurred_at - start) // _MS, cumulative[-1], 0, blocks))
        sources.append(request)
    return OwnTrace(records, sources, start, len(requests) - len(records))
