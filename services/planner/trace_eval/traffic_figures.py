"""What a team's own request events say about warming, before any simulation. Pure: no I/O, no clock.

- The cold-start penalty: time to first token of requests that found no cached tokens against those that
  found some (the engine's own `cached_tokens`), with their prompt sizes, since a cold request is often
  also a longer one.
- The reuse distribution: how many requests share each root prefix and each leaf (whole chain), and the
  share of requests (and of chain tokens) whose prefix was seen within the last 1, 5 and 60 minutes: the
  most a prefix cache keeping that long could hit, with perfect routing.
- Exact repeats: requests whose whole chain and prompt size were seen before, the most a result cache
  could answer (it also needs equal sampling parameters, which events do not carry).

Every function takes requests in arrival order (see `own_trace.select`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from warmplane.shared.events import RequestObserved

REUSE_WINDOWS_S: Final = (60.0, 300.0, 3600.0)
SHARE_BUCKETS: Final = ((1, 1), (2, 9), (10, 99), (100, None))
"""Requests per prefix, as the rows of the reuse distribution: 1, 2-9, 10-99, 100 or more."""


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The `q`-quantile by nearest rank: the ⌈q·n⌉-th smallest value (the median of 4 values is the 2nd).
    Raises `ValueError` for no values or `q` outside (0, 1]."""
    if not values or not 0.0 < q <= 1.0:
        raise ValueError("nearest_rank needs values and 0 < q <= 1")
    return sorted(values)[math.ceil(q * len(values)) - 1]


@dataclass(frozen=True, slots=True)
class TtftGroup:
    """Requests of one kind that report a TTFT: their count, TTFT median and p90 (ms), median prompt
    tokens; the figures are None when the group is empty."""

    requests: int
    median_ms: float | None
    p90_ms: float | None
    median_prompt_tokens: float | None


@dataclass(frozen=True, slots=True)
class ColdStartPenalty:
    """TTFT of requests with no cached tokens (`cold`) against those with some (`warm`); `without_ttft`
    counts requests that report none (non-streaming, or replayed traces)."""

    cold: TtftGroup
    warm: TtftGroup
    without_ttft: int

    @property
    def median_ratio(self) -> float | None:
        """Cold median TTFT over warm median TTFT; None unless both groups have a positive median."""
        return _ratio(self.cold.median_ms, self.warm.median_ms)

    @property
    def p90_ratio(self) -> float | None:
        return _ratio(self.cold.p90_ms, self.warm.p90_ms)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _ttft_group(requests: Sequence[RequestObserved]) -> TtftGroup:
    if not requests:
        return TtftGroup(0, None, None, None)
    ttfts = [r.ttft_ms for r in requests if r.ttft_ms is not None]
    prompts = [float(r.prompt_tokens) for r in requests]
    return TtftGroup(
        len(requests), nearest_rank(ttfts, 0.5), nearest_rank(ttfts, 0.9), nearest_rank(prompts, 0.5)
    )


def cold_start_penalty(requests: Sequence[RequestObserved]) -> ColdStartPenalty:
    """The penalty measured on `requests` that report a TTFT, split by `cached_tokens == 0`."""
    timed = [r for r in requests if r.ttft_ms is not None]
    return ColdStartPenalty(
        _ttft_group([r for r in timed if r.cached_tokens == 0]),
        _ttft_group([r for r in timed if r.cached_tokens > 0]),
        len(requests) - len(timed),
    )


@dataclass(frozen=True, slots=True)
class ShareRow:
    """Prefixes carried by `low`..`high` requests each (`high` None: no upper bound): how many such
    prefixes, and the share of all requests they carry."""

    low: int
    high: int | None
    prefixes: int
    request_share: float


def share_rows(per_prefix: Counter[int]) -> list[ShareRow]:
    """The distribution of `per_prefix` (requests per prefix id) over `SHARE_BUCKETS`."""
    total = sum(per_prefix.values())
    rows = []
    for low, high in SHARE_BUCKETS:
        counts = [n for n in per_prefix.values() if n >= low and (high is None or n <= high)]
        rows.append(ShareRow(low, high, len(counts), sum(counts) / total if total else 0.0))
    return rows


@dataclass(frozen=True, slots=True)
class SeenBefore:
    """Within `window_s` before each request: the share of requests whose root prefix was seen (so some
    prefix could have been cached) and the share of chain tokens in the longest prefix seen."""

    window_s: float
    request_share: float
    token_share: float


def seen_before(
    requests: Sequence[RequestObserved], windows_s: Sequence[float] = REUSE_WINDOWS_S
) -> list[SeenBefore]:
    """For each window, how much of `requests` an earlier request (within the window) had already carried.
    A prefix seen at the same instant counts as seen (the earlier one in order computed it)."""
    last_seen: dict[int, float] = {}
    hits = [0] * len(windows_s)
    seen_tokens = [0] * len(windows_s)
    start = requests[0].occurred_at if requests else None
    for request in requests:
        t = (request.occurred_at - start).total_seconds() if start is not None else 0.0
        for w, window in enumerate(windows_s):
            depth = 0
            # Ids are chained, so an element seen implies its ancestors were seen then too: the run of
            # recently seen elements from the root is the longest prefix seen within the window.
            for element in request.chain:
                if last_seen.get(element, -math.inf) < t - window:
                    break
                depth += 1
            hits[w] += depth > 0
            seen_tokens[w] += request.chain_tokens[depth - 1] if depth else 0
        for element in request.chain:
            last_seen[element] = t
    chain_tokens = sum(r.chain_tokens[-1] for r in requests)
    return [
        SeenBefore(window, hits[w] / len(requests) if requests else 0.0, _share(seen_tokens[w], chain_tokens))
        for w, window in enumerate(windows_s)
    ]


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def exact_repeats(requests: Sequence[RequestObserved]) -> int:
    """Requests whose whole chain (its last id) and `prompt_tokens` equal an earlier request's."""
    seen: set[tuple[int, int]] = set()
    repeats = 0
    for request in requests:
        key = (request.chain[-1], request.prompt_tokens)
        repeats += key in seen
        seen.add(key)
    return repeats


@dataclass(frozen=True, slots=True)
class TrafficFigures:
    """Everything `traffic_figures` measures on one tenant's and model's requests."""

    requests: int
    span_s: float
    prompt_tokens: int
    chain_tokens: int
    penalty: ColdStartPenalty
    roots: list[ShareRow]
    leaves: list[ShareRow]
    seen: list[SeenBefore]
    exact_repeats: int


def traffic_figures(requests: Sequence[RequestObserved]) -> TrafficFigures:
    """All of the module's figures for `requests` (in arrival order; none gives zeros)."""
    span = (requests[-1].occurred_at - requests[0].occurred_at).total_seconds() if requests else 0.0
    return TrafficFigures(
        len(requests),
        span,
        sum(r.prompt_tokens for r in requests),
        sum(r.chain_tokens[-1] for r in requests),
        cold_start_penalty(requests),
        share_rows(Counter(r.chain[0] for r in requests)),
        share_rows(Counter(r.chain[-1] for r in requests)),
        seen_before(requests),
        exact_repeats(requests),
    )
