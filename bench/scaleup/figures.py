"""The scenario's figures, from what the client saw in each run. Pure: samples in, numbers and Markdown out.

Times are relative to the join J (the `fleet.scaled` event, which the new engine's start follows at once)
and to F, the newcomer's first request (the first one its answer names it for):
- newcomer's first minute: its requests sent in [F, F + 60 s);
- fleet, first minute: every request sent in [J, J + 60 s); minutes 1 to 5: [J + 60 s, J + 300 s);
- newcomer's share: of the requests sent in [F, F + 60 s), the part it served;
- established replicas while the newcomer warms: their requests sent in [J, F), against [J − 60 s, J);
- steady state: the newcomer's requests in the run's last minute (their p50 TTFT, and the share of their
  prompt tokens found cached: a router that follows where a conversation's blocks live keeps it high, a
  ring that moved the conversation at the join does not).
A request that got no first chunk counts in `errors`, never in a percentile.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from warmplane.services.devstack.chat_load import Sample

MINUTE_S = 60.0
FLEET_LATE_S = (60.0, 300.0)


@dataclass(frozen=True, slots=True)
class RunRecord:
    arm: str
    run: int
    join: float
    """Monotonic time of the join."""
    end: float
    """Monotonic time the last request was sent."""
    newcomer: str
    samples: list[Sample]
    warm_tokens: int | None
    """Prompt tokens the newcomer computed (not found cached) before its first request: the warm-up's
    prefill; None when not measured."""
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds each part used over the replay (the engines, the arm's processes, this process); empty
    in runs kept before it was measured."""


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0-100) by linear interpolation between closest ranks; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ttfts(samples: Sequence[Sample], keep: Callable[[Sample], bool]) -> list[float]:
    return [s.ttft for s in samples if s.ttft is not None and keep(s)]


@dataclass
class RunFigures:
    """One run's figures; seconds unless named otherwise, NaN where a window held no request."""

    arm: str
    values: dict[str, float] = field(default_factory=dict)


def run_figures(record: RunRecord) -> RunFigures:
    samples, join, newcomer = record.samples, record.join, record.newcomer
    served_new = [s.sent for s in samples if s.replica == newcomer]
    first = min(served_new) if served_new else math.inf
    out = RunFigures(record.arm)
    v = out.values
    v["first_request_s"] = first - join if served_new else math.nan

    def window(lo: float, hi: float, who: Callable[[Sample], bool] = lambda s: True) -> list[float]:
        return _ttfts(samples, lambda s: lo <= s.sent < hi and who(s))

    new_minute = window(first, first + MINUTE_S, lambda s: s.replica == newcomer)
    for q in (50, 90, 99):
        v[f"newcomer_p{q}"] = percentile(new_minute, q)
    fleet_minute = window(join, join + MINUTE_S)
    late_lo, late_hi = FLEET_LATE_S
    fleet_late = window(join + late_lo, min(join + late_hi, record.end + 1))
    for q in (50, 90, 99):
        v[f"fleet_p{q}"] = percentile(fleet_minute, q)
        v[f"fleet_late_p{q}"] = percentile(fleet_late, q)
    in_minute = [s for s in samples if first <= s.sent < first + MINUTE_S]
    # What a warm can change: the share of the newcomer's first-minute prompt tokens it found cached.
    v["newcomer_cached"] = _cached_share(in_minute, newcomer)
    v["newcomer_share"] = (
        sum(s.replica == newcomer for s in in_minute) / len(in_minute) if in_minute else math.nan
    )
    established = [s for s in samples if s.replica not in (newcomer, None)]
    v["established_before_p99"] = percentile(
        _ttfts(established, lambda s: join - MINUTE_S <= s.sent < join), 99
    )
    v["established_during_p99"] = percentile(_ttfts(established, lambda s: join <= s.sent < first), 99)
    v["steady_p50"] = percentile(
        window(record.end - MINUTE_S, record.end + 1, lambda s: s.replica == newcomer), 50
    )
    v["steady_cached"] = _cached_share([s for s in samples if s.sent >= record.end - MINUTE_S], newcomer)
    v["warm_tokens"] = math.nan if record.warm_tokens is None else float(record.warm_tokens)
    v["requests"] = float(len(samples))
    v["errors"] = float(sum(s.ttft is None for s in samples))
    return out


def _cached_share(samples: Sequence[Sample], replica: str) -> float:
    """Of the prompt tokens `replica` answered in `samples`, the share it found cached; NaN for none."""
    answered = [s for s in samples if s.replica == replica and s.status == 200]
    prompt = sum(s.prompt_tokens for s in answered)
    return sum(s.cached_tokens for s in answered) / prompt if prompt else math.nan


def medians(figures: Sequence[RunFigures]) -> dict[str, dict[str, float]]:
    """Per arm, the median over its runs of each figure (NaN runs left out; NaN if all are)."""
    by_arm: dict[str, list[RunFigures]] = {}
    for f in figures:
        by_arm.setdefault(f.arm, []).append(f)
    out: dict[str, dict[str, float]] = {}
    for arm, runs in by_arm.items():
        names = runs[0].values.keys()
        out[arm] = {}
        for name in names:
            finite = [r.values[name] for r in runs if not math.isnan(r.values[name])]
            out[arm][name] = statistics.median(finite) if finite else math.nan
    return out


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def timeline(
    records: Sequence[RunRecord], *, before_s: float, after_s: float, bin_s: float = 10.0
) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Per arm, p50 TTFT over time around the join (bins of `bin_s`, runs pooled): `fleet` and `newcomer`
    series of (seconds since the join, p50 seconds); empty bins left out."""
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    bins = int((before_s + after_s) // bin_s)
    for arm in dict.fromkeys(r.arm for r in records):
        fleet: list[list[float]] = [[] for _ in range(bins)]
        new: list[list[float]] = [[] for _ in range(bins)]
        for record in (r for r in records if r.arm == arm):
            for s in record.samples:
                index = int((s.sent - record.join + before_s) // bin_s)
                if s.ttft is None or not 0 <= index < bins:
                    continue
                fleet[index].append(s.ttft)
                if s.replica == record.newcomer:
                    new[index].append(s.ttft)
        centre = [i * bin_s - before_s + bin_s / 2 for i in range(bins)]
        out[arm] = {
            "fleet": [(c, statistics.median(b)) for c, b in zip(centre, fleet, strict=True) if b],
            "newcomer": [(c, statistics.median(b)) for c, b in zip(centre, new, strict=True) if b],
        }
    return out
