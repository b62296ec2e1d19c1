"""The scenario's report: the per-arm table (medians over runs), the ratios the issue sets targets for,
and the picture of TTFT around the join."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.scaleup.figures import RunRecord, medians, ratio, run_figures, timeline

COLD, OURS, CACHE_AWARE = "gateway-cold", "warmplane", "vllm-router-cache-aware"
TARGETS = (
    # (what, numerator arm and figure, denominator arm and figure, the most the ratio may be)
    ("newcomer's first-minute p50 TTFT, warmed / cold", OURS, "newcomer_p50", COLD, "newcomer_p50", 0.25),
    ("newcomer's first-minute p50 TTFT, warmed / its steady state", OURS, "newcomer_p50", OURS,
     "steady_p50", 1.2),
    ("fleet first-minute p99 TTFT, Warmplane / vllm-router cache_aware", OURS, "fleet_p99", CACHE_AWARE,
     "fleet_p99", 1 / 3),
    ("established replicas' p99 TTFT while the newcomer warms / before", OURS, "established_during_p99", OURS,
     "established_before_p99", 1.1),
)  # fmt: skip


def _ms(value: float) -> str:
    return "–" if math.isnan(value) else f"{value * 1000:,.0f}"


def _share(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.0%}"


def _triple(values: Mapping[str, float], prefix: str) -> str:
    return " / ".join(_ms(values[f"{prefix}_p{q}"]) for q in (50, 90, 99))


def table(by_arm: Mapping[str, Mapping[str, float]], runs: Mapping[str, int]) -> str:
    head = (
        "| arm | runs | newcomer, first minute: p50 / p90 / p99 ms | its share | its prompt tokens cached "
        "| join → its first request "
        "| warm prefill tokens | fleet, first minute: p50 / p90 / p99 ms "
        "| fleet, minutes 1–5: p50 / p90 / p99 ms | established p99 ms: before → while it warms "
        "| newcomer steady: p50 ms, tokens cached | requests (errors) |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = []
    for arm, v in by_arm.items():
        share = _share(v["newcomer_share"])
        cached = _share(v.get("newcomer_cached", math.nan))
        first = "–" if math.isnan(v["first_request_s"]) else f"{v['first_request_s']:.1f} s"
        tokens = "–" if math.isnan(v["warm_tokens"]) else f"{v['warm_tokens']:,.0f}"
        rows.append(
            f"| {arm} | {runs[arm]} | {_triple(v, 'newcomer')} | {share} | {cached} | {first} | {tokens} | "
            f"{_triple(v, 'fleet')} | {_triple(v, 'fleet_late')} | "
            f"{_ms(v['established_before_p99'])} → {_ms(v['established_during_p99'])} | "
            f"{_ms(v['steady_p50'])}, {_share(v.get('steady_cached', math.nan))} | "
            f"{v['requests']:.0f} ({v['errors']:.0f}) |"
        )
    return head + "\n".join(rows) + "\n"


@dataclass(frozen=True, slots=True)
class Compared:
    """One target's two figures, from arms measured in the same run."""

    what: str
    name: str
    value: float
    baseline_name: str
    baseline: float
    target: float


def compared(by_arm: Mapping[str, Mapping[str, float]]) -> list[Compared]:
    """Each target both of whose arms ran."""
    return [
        Compared(
            what, f"{num_arm}: {num}", by_arm[num_arm][num], f"{den_arm}: {den}", by_arm[den_arm][den], target
        )
        for what, num_arm, num, den_arm, den, target in TARGETS
        if num_arm in by_arm and den_arm in by_arm
    ]


def targets(by_arm: Mapping[str, Mapping[str, float]]) -> str:
    """The targets table: each ratio, its target, and whether it is met."""
    lines = ["| ratio | measured | target | met |", "|---|---:|---:|---|"]
    for c in compared(by_arm):
        value = ratio(c.value, c.baseline)
        met = "–" if math.isnan(value) else ("yes" if value <= c.target else "no")
        lines.append(f"| {c.what} | {value:.2f} | ≤ {c.target:.2f} | {met} |")
    return "\n".join(lines) + "\n"


def headline(by_arm: Mapping[str, Mapping[str, float]]) -> list[tuple[str, float, str, float]]:
    """The figures `bench.report` puts in its headline table: (name, seconds, baseline name, seconds);
    figures with an empty window are left out."""
    return [
        (c.name, c.value, f"{c.baseline_name} ({c.what})", c.baseline)
        for c in compared(by_arm)
        if not math.isnan(ratio(c.value, c.baseline))
    ]


def summarise(records: Sequence[RunRecord]) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    figures = [run_figures(record) for record in records]
    runs: dict[str, int] = {}
    for record in records:
        runs[record.arm] = runs.get(record.arm, 0) + 1
    return medians(figures), runs


def cpu_table(records: Sequence[RunRecord]) -> str:
    """CPU seconds each part used over the replay, per arm (median over its runs); empty when no run kept
    them. The engines' two cores are what every other part competes with."""
    used: dict[str, dict[str, list[float]]] = {}
    for record in records:
        for part, seconds in record.cpu_s.items():
            used.setdefault(part, {}).setdefault(record.arm, []).append(seconds)
    if not used:
        return ""
    arms = list(dict.fromkeys(record.arm for record in records))
    lines = ["| part | " + " | ".join(arms) + " |", "|---|" + "---:|" * len(arms)]
    for part in sorted(used, key=lambda name: (name.startswith("bench"), name)):
        cells = [f"{statistics.median(used[part][arm]):.1f}" if arm in used[part] else "–" for arm in arms]
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def picture(records: Sequence[RunRecord], path: Path, *, before_s: float, after_s: float) -> None:
    """Fleet (solid) and newcomer (dashed) p50 TTFT in 10 s bins around the join, one colour per arm."""
    import matplotlib  # the bench extra; imported here so the figures stay importable without it

    matplotlib.use("Agg")
    from matplotlib import pyplot

    series = timeline(records, before_s=before_s, after_s=after_s)
    figure, axes = pyplot.subplots(figsize=(10, 5.5), dpi=120)
    colours = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (arm, lines) in enumerate(series.items()):
        colour = colours[index % len(colours)]
        for kind, style in (("fleet", "-"), ("newcomer", "--")):
            points = lines[kind]
            if points:
                xs, ys = zip(*points, strict=True)
                axes.plot(xs, [y * 1000 for y in ys], style, color=colour, label=f"{arm}: {kind}")
    axes.axvline(0, color="grey", linewidth=1)
    axes.text(1, axes.get_ylim()[1] * 0.9, "scale-up", color="grey")
    axes.set_yscale("log")
    axes.set_xlabel("seconds since the scale-up (fleet.scaled; the new engine starts)")
    axes.set_ylabel("time to first token, p50 of 10 s bins (ms)")
    axes.set_title("A replica joins mid-replay: fleet and newcomer TTFT, per arm (runs pooled)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    pyplot.close(figure)
