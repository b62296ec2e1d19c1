"""The fleet simulation behind the trace evaluator: a Mooncake trace routed over a hash ring to replicas
that each hold an LRU cache of KV blocks, with one replica joining mid-trace.

Model (and its limits): prefill is instantaneous, so a block is cached as soon as the request that computes
it arrives (no in-flight misses, no queueing); a request hits the longest run of its chain's leading blocks
that its replica holds (prefix semantics); its blocks are then touched deepest first, so that, as in vLLM,
a chain's tail is evicted before its head. Routing does not depend on caches, so it is computed once and
every policy sees the same requests on the same replicas.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from warmplane.shared.hash_ring import HashRing
from warmplane.shared.mooncake_trace import TRACE_BLOCK_TOKENS, TraceRequest, cumulative_tokens, read_trace


@dataclass(frozen=True, slots=True)
class Request:
    """One trace request: arrival `t` (seconds), its chain, each block's own tokens, its routing key."""

    t: float
    chain: tuple[int, ...]
    own_tokens: tuple[int, ...]
    cumulative: tuple[int, ...]
    key: int


def requests_from_trace(
    records: Iterable[TraceRequest], block_tokens: int, trace_block_tokens: int = TRACE_BLOCK_TOKENS
) -> list[Request]:
    """The requests of `records` in arrival order (a stable sort: equal times keep their order), keys still
    unset (the root: see `with_routing_depth`). `trace_block_tokens` is the block size the records'
    `input_length` was recorded with; a `block_tokens` below it shrinks blocks and lengths alike (see
    `cumulative_tokens`), equal to it takes them as they are."""
    requests = []
    for record in records:
        cumulative = cumulative_tokens(record, block_tokens, trace_block_tokens)
        own = [b - a for a, b in zip([0, *cumulative[:-1]], cumulative, strict=True)]
        chain = tuple(record.hash_ids)
        requests.append(Request(record.timestamp / 1000, chain, tuple(own), tuple(cumulative), chain[0]))
    requests.sort(key=lambda request: request.t)
    return requests


def load_requests(
    path: Path, block_tokens: int, trace_block_tokens: int = TRACE_BLOCK_TOKENS
) -> list[Request]:
    """The requests of the Mooncake trace at `path`: see `requests_from_trace`. Raises `ValueError`
    naming a bad line."""
    return requests_from_trace(read_trace(path), block_tokens, trace_block_tokens)


def routing_key(chain: Sequence[int], depth: int) -> int:
    """The element a request is routed by: its chain's element at `depth`, or its last one."""
    return chain[min(depth, len(chain) - 1)]


def auto_routing_depth(requests: Sequence[Request], max_key_share: float) -> int:
    """The shallowest depth whose most common routing key carries at most `max_key_share` of the requests:
    the root (0) unless everyone shares it, as in the conversation trace, where depth 1 spreads the load."""
    for depth in range(8):
        keys = Counter(routing_key(request.chain, depth) for request in requests)
        if keys.most_common(1)[0][1] <= max_key_share * len(requests):
            return depth
    return 8


def with_routing_depth(requests: Sequence[Request], depth: int) -> list[Request]:
    """`requests` keyed by their chain element at `depth`."""
    return [Request(r.t, r.chain, r.own_tokens, r.cumulative, routing_key(r.chain, depth)) for r in requests]


def route(
    requests: Sequence[Request],
    before: HashRing,
    after: HashRing,
    join_t: float,
    load_window_s: float,
) -> list[str]:
    """The replica of each request: `before`'s choice until `join_t`, `after`'s from then on, each by
    `HashRing.pick` (sticky by key, bounded load) over the requests each replica took in the last
    `load_window_s` seconds."""
    window: deque[tuple[float, str]] = deque()
    loads: Counter[str] = Counter()
    replicas = []
    for request in requests:
        while window and window[0][0] <= request.t - load_window_s:
            loads[window.popleft()[1]] -= 1
        ring = before if request.t < join_t else after
        replica = ring.pick(request.key, loads)
        loads[replica] += 1
        window.append((request.t, replica))
        replicas.append(replica)
    return replicas


class LruCache:
    """KV blocks of one replica, least recently used first, at most `capacity_blocks` of them."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self.blocks: OrderedDict[int, int] = OrderedDict()
        """Block id to its own tokens."""

    def leading_hits(self, chain: Sequence[int]) -> int:
        """How many of `chain`'s leading blocks are held."""
        hits = 0
        for block in chain:
            if block not in self.blocks:
                break
            hits += 1
        return hits

    def touch(self, chain: Sequence[int], own_tokens: Sequence[int]) -> int:
        """Hold every block of `chain`, deepest touched first (the head ends most recent); returns the
        tokens of the blocks that were not held (what computing them costs)."""
        computed = 0
        for block, tokens in zip(reversed(chain), reversed(own_tokens), strict=True):
            if block in self.blocks:
                self.blocks.move_to_end(block)
            else:
                self.blocks[block] = tokens
                computed += tokens
        while len(self.blocks) > self.capacity_blocks:
            self.blocks.popitem(last=False)
        return computed

    def most_recent(self, max_tokens: int) -> list[tuple[int, int]]:
        """The most recently used blocks, most recent first, up to `max_tokens` of them."""
        chosen, total = [], 0
        for block, tokens in reversed(self.blocks.items()):
            if total + tokens > max_tokens:
                break
            chosen.append((block, tokens))
            total += tokens
        return chosen


@dataclass(frozen=True, slots=True)
class Served:
    """What one request found on its replica: hit blocks and tokens against its prompt's."""

    t: float
    replica: str
    hit_blocks: int
    blocks: int
    hit_tokens: int


def serve(cache: LruCache, request: Request, replica: str) -> Served:
    """Serve `request` from `cache`: count its leading hits, then hold its blocks."""
    hits = cache.leading_hits(request.chain)
    cache.touch(request.chain, request.own_tokens)
    return Served(request.t, replica, hits, len(request.chain), sum(request.own_tokens[:hits]))
