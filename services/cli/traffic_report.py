"""`warmplane evaluate-traffic`'s report as Markdown: what was read, the cold-start penalty, the reuse
distribution, the trace evaluator's table on this traffic, and which cold-start tiers would pay."""

from __future__ import annotations

from dataclasses import dataclass

from warmplane.services.cli.request_topic import RequestLog
from warmplane.services.planner.trace_eval.evaluation import TraceResult
from warmplane.services.planner.trace_eval.own_trace import OwnTrace, PartialBlocks, TrafficFilter
from warmplane.services.planner.trace_eval.params import EvalParams
from warmplane.services.planner.trace_eval.report import decision_line, policy_table, setting
from warmplane.services.planner.trace_eval.traffic_figures import ShareRow, TrafficFigures, TtftGroup


@dataclass(frozen=True, slots=True)
class TrafficReport:
    """Everything one run found: the command line, what it read and selected, the export and its
    settings, the figures from the events and the evaluator's result (None when no request had a block)."""

    command: str
    topic: str
    traffic: TrafficFilter
    log: RequestLog
    trace: OwnTrace
    partial: PartialBlocks
    params: EvalParams
    figures: TrafficFigures
    result: TraceResult | None


def render(report: TrafficReport) -> str:
    """The whole report; every section says when it has nothing to show."""
    traffic = report.traffic
    model = traffic.model + (f" (revision {traffic.revision})" if traffic.revision is not None else "")
    return "\n".join(
        [
            f"# What warming would buy: tenant {traffic.tenant}, model {model}",
            "",
            "Command:",
            "",
            f"    {report.command}",
            "",
            *_read(report),
            "## Cold-start penalty (the events' TTFT and cached tokens)",
            "",
            *_penalty(report.figures),
            "## Reuse",
            "",
            *_reuse(report.figures),
            "## KV prefix warming (the trace evaluator on this traffic)",
            "",
            *_evaluation(report),
            "## Which tiers pay",
            "",
            *_tiers(report),
        ]
    )


def _read(report: TrafficReport) -> list[str]:
    log, figures, trace = report.log, report.figures, report.trace
    window = f"from {report.traffic.since or 'the beginning'} until {report.traffic.until or 'the end'}"
    coverage = figures.chain_tokens / figures.prompt_tokens if figures.prompt_tokens else 0.0
    partial = (
        "kept (Mooncake's convention)" if report.partial == "keep" else "dropped (vLLM caches full blocks)"
    )
    return [
        f"Read {log.records:,} records of `{report.topic}` (earliest to the end at the start; no consumer"
        f" group): {log.skipped_by_key:,} of other tenants or models skipped by key,"
        f" {log.undecodable:,} undecodable, {log.other_events:,} other events.",
        f"Selected {figures.requests:,} requests {window}, spanning {figures.span_s:,.0f} s;"
        f" their chains cover {coverage:.1%} of their prompt tokens.",
        f"Exported as a Mooncake trace of {report.params.block_tokens}-token blocks, partial blocks"
        f" {partial}:"
        f" {len(trace.records):,} requests, {sum(len(r.hash_ids) for r in trace.records):,} blocks,"
        f" {_count(trace.blockless, 'request')} without a full block left out.",
        "",
    ]


def _penalty(figures: TrafficFigures) -> list[str]:
    penalty = figures.penalty
    if not penalty.cold.requests and not penalty.warm.requests:
        return [
            f"No request reports a TTFT ({penalty.without_ttft:,} without one: non-streaming requests and"
            " replayed traces carry none), so the penalty cannot be measured here.",
            "",
        ]
    return [
        "| requests | count | TTFT median ms | TTFT p90 ms | prompt tokens median |",
        "|---|---:|---:|---:|---:|",
        _group_row("no cached tokens (cold)", penalty.cold),
        _group_row("some cached tokens", penalty.warm),
        "",
        f"Cold over cached: median {_times(penalty.median_ratio)}, p90 {_times(penalty.p90_ratio)};"
        f" {_count(penalty.without_ttft, 'request')} without a TTFT left out. Quantiles by nearest rank;"
        " compare the prompt sizes before reading the ratio as the cache's alone.",
        "",
    ]


def _group_row(name: str, group: TtftGroup) -> str:
    return (
        f"| {name} | {group.requests:,} | {_number(group.median_ms)} | {_number(group.p90_ms)}"
        f" | {_number(group.median_prompt_tokens)} |"
    )


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _reuse(figures: TrafficFigures) -> list[str]:
    seen = figures.seen
    return [
        "| requests per prefix | root prefixes | their share of requests | leaves (whole chains)"
        " | their share of requests |",
        "|---|---:|---:|---:|---:|",
        *(_share_row(root, leaf) for root, leaf in zip(figures.roots, figures.leaves, strict=True)),
        "",
        "| seen within | requests with a prefix seen | chain tokens in the longest prefix seen |",
        "|---|---:|---:|",
        *(f"| {s.window_s / 60:g} min | {s.request_share:.1%} | {s.token_share:.1%} |" for s in seen),
        "",
        "The token share is what a prefix cache keeping everything seen in the window could hit, with"
        " perfect routing: an upper bound for any warm set.",
        "",
    ]


def _share_row(root: ShareRow, leaf: ShareRow) -> str:
    if root.high is None:
        size = f"{root.low}+"
    else:
        size = f"{root.low}" if root.high == root.low else f"{root.low}-{root.high}"
    return (
        f"| {size} | {root.prefixes:,} | {root.request_share:.1%} | {leaf.prefixes:,}"
        f" | {leaf.request_share:.1%} |"
    )


def _evaluation(report: TrafficReport) -> list[str]:
    if report.result is None:
        return ["No request has a block to simulate.", ""]
    return [
        f"Parameters: {report.params.describe()}.",
        "",
        f"{setting(report.result)}.",
        "",
        *policy_table(report.result),
        "",
        *decision_line(report.result),
    ]


def _tiers(report: TrafficReport) -> list[str]:
    figures = report.figures
    repeats = figures.exact_repeats / figures.requests if figures.requests else 0.0
    return [
        "| tier | what this traffic says |",
        "|---|---|",
        "| weights | not in request events (replica lifecycle: the time from started to weights loaded) |",
        f"| KV prefixes | {_kv_tier(report.result)} |",
        f"| result cache | {_count(figures.exact_repeats, 'exact repeat')} ({repeats:.1%} of requests:"
        " same whole chain and prompt size as an earlier one), an upper bound of its hits |",
        "",
    ]


def _kv_tier(result: TraceResult | None) -> str:
    if result is None:
        return "nothing to simulate"
    if not result.new_requests:
        return "the joining replica takes no request after the join: too little traffic to tell"
    ours, none = result.by_policy("warmplane"), result.by_policy("none")
    return (
        f"warming the joining replica lifts its first-minute hit ratio from {none.hit_1m:.3f} to"
        f" {ours.hit_1m:.3f} (5 min: {none.hit_5m:.3f} to {ours.hit_5m:.3f}); it prefills"
        f" {ours.spent:,} tokens to save {ours.saved:,}: yield {ours.yield_:.2f}"
    )
