"""The trace evaluator's figures as Markdown: a trace's setting, the policy table, the issue's targets."""

from __future__ import annotations

from warmplane.services.planner.trace_eval.evaluation import Outcome, TraceResult

NOTES = (
    "The warmplane row runs the planner's own code path: the history before the join stored as the planner"
    " stores it (requests per leaf and --bucket-seconds bucket), then policy.trie_from_counts and"
    " policy.choose_for_replica, the functions plan_choice.WarmSetChooser calls."
    " Its knobs and cap are the planner's defaults (policy.PolicyKnobs): a rate estimated as the mean"
    " of a recency estimate (half-life 60 s, chosen on the conversation trace by a small grid) and a"
    " frequency estimate (half-life 600 s, for shared documents), ramp window 300 s, least reuse"
    " probability 0.3, cap 0.5 of KV capacity. In this simulation prefill is instantaneous, so a warmed block"
    " saves at most its one first prefill on the newcomer: yield is at most about 1.0 by construction"
    " (eviction order aside), and equals 1.0 only when every warmed block is used. The seed replay is"
    " not held to the token cap. The (ceiling) row is no policy: it knows the future, and warms every"
    " block seen before the join that the newcomer uses in its first 5 minutes, in order of first use,"
    " within the cap; no policy that knows only the history warms more usefully (eviction aside)."
)


def targets(result: TraceResult) -> list[str]:
    """The issue's targets, each with its numbers and whether it is met."""
    ours, peer = result.by_policy("warmplane"), result.by_policy("peer-copy")
    seeds = [result.by_policy("seed-replay"), result.by_policy("top-50")]
    keep = ours.saved_5m / peer.saved_5m if peer.saved_5m > 0 else float("inf")
    lines = [
        f"first-minute hit ratio {ours.hit_1m:.3f} vs 0.9 x steady {result.steady:.3f} = "
        f"{0.9 * result.steady:.3f}: {_met(ours.hit_1m >= 0.9 * result.steady)}",
        f"yield {ours.yield_:.2f} >= 1.0: {_met(ours.yield_ >= 1.0)}; "
        f"5-minute gain {keep:.0%} of peer-copy's (>= 80%): {_met(keep >= 0.8)}",
    ]
    ceiling = result.ceiling.hit_1m
    reach = (
        "within reach" if ceiling >= 0.9 * result.steady else "beyond any policy that knows only the history"
    )
    lines.append(
        f"the ceiling's first-minute hit ratio is {ceiling:.3f} (yield {result.ceiling.yield_:.2f}): the"
        f" first-minute target is {reach}"
    )
    for seed in seeds:
        beaten = ours.hit_1m > seed.hit_1m and ours.yield_ > seed.yield_
        lines.append(
            f"beats {seed.policy} on first-minute hit ratio ({ours.hit_1m:.3f} vs {seed.hit_1m:.3f}) and "
            f"yield ({ours.yield_:.2f} vs {seed.yield_:.2f}): {_met(beaten)}"
        )
    return lines


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def policy_table(result: TraceResult) -> list[str]:
    """The per-policy table's lines, the established replicas last."""
    old_1m, old_5m, old_all = result.established
    return [
        "| policy | hit 1 min | hit 5 min | hit after join | cold req. 5 min | warm tokens | saved tokens"
        " | yield | saved 5 min |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_row(o) for o in result.outcomes),
        _row(result.ceiling),
        f"| (established replicas, unwarmed) | {old_1m:.3f} | {old_5m:.3f} | {old_all:.3f} | | | | | |",
    ]


def _row(o: Outcome) -> str:
    return (
        f"| {o.policy} | {o.hit_1m:.3f} | {o.hit_5m:.3f} | {o.hit_all:.3f} | {o.cold_5m} | {o.spent:,} | "
        f"{o.saved:,} | {o.yield_:.2f} | {o.saved_5m:,} |"
    )


def setting(result: TraceResult) -> str:
    """One sentence on the run: requests, join, routing depth, the newcomer's share and steady state."""
    return (
        f"{result.requests:,} requests; join at {result.join_t:.0f} s;"
        f" routing depth {result.routing_depth};"
        f" the newcomer takes {result.new_requests:,} requests after the join, most from"
        f" {result.donor or 'no one'};"
        f" its steady hit ratio (unwarmed, from 5 min after the join) {result.steady:.3f}"
    )


def render(result: TraceResult, seconds: float | None = None) -> str:
    """One trace's results as Markdown: setting, table, targets; `seconds` the simulation took, if known."""
    took = "" if seconds is None else f"; simulated in {seconds:.1f} s"
    return "\n".join(
        [
            f"### {result.name}",
            "",
            f"{setting(result)}{took}.",
            "",
            *policy_table(result),
            "",
            *(f"- {line}" for line in targets(result)),
            "",
        ]
    )
