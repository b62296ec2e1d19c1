"""The frontier as a picture: per trace, warm tokens against the newcomer's first-minute and 5-minute hit
ratios, for the planner's knob swept, the ceiling's curve and each baseline's point
(`python -m bench.evaluate_policy --plot FILE`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from warmplane.services.planner.trace_eval.evaluation import TraceResult

BASELINES = ("seed-replay", "top-50", "peer-copy")


def picture(results: Sequence[TraceResult], path: Path) -> None:
    """One column per trace, first minute above and 5 minutes below; tokens on a log scale."""
    import matplotlib  # the bench extra; imported here so the evaluator runs without it

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(2, len(results), figsize=(5 * len(results), 8), dpi=110, squeeze=False)
    for column, result in enumerate(results):
        for row, (field, window) in enumerate((("hit_1m", "first minute"), ("hit_5m", "first 5 minutes"))):
            ax = axes[row][column]
            frontier = sorted((p for p in result.frontier if p.tokens > 0), key=lambda p: p.tokens)
            curve = sorted((p for p in result.ceiling_curve if p.tokens > 0), key=lambda p: p.tokens)
            ax.plot(
                [p.tokens for p in frontier], [getattr(p, field) for p in frontier], "o-", label="warmplane"
            )
            ax.plot([p.tokens for p in curve], [getattr(p, field) for p in curve], "s--", label="ceiling")
            ours = result.by_policy("warmplane")
            ax.plot([ours.spent], [getattr(ours, field)], "*", markersize=14, label="warmplane default")
            for name in BASELINES:
                theirs = result.by_policy(name)
                ax.plot([theirs.spent], [getattr(theirs, field)], "x", markersize=9, label=name)
            ax.axhline(getattr(result.by_policy("none"), field), color="grey", linewidth=1, label="none")
            ax.set_xscale("log")
            ax.set_xlabel("warm tokens")
            ax.set_ylabel(f"newcomer's hit ratio, {window}")
            ax.set_title(result.name, fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    pyplot.close(figure)
