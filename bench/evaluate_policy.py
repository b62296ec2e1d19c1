"""Warm-set policies on recorded traces: how much a replica joining mid-trace gains from each. Run from the
project root:

    python -m bench.evaluate_policy [--trace FILE ...] [--block-tokens 512] [--replicas 4] \
        [--capacity-blocks 8000] [--join-at 0.5] [--routing-depth auto] \
        [--output bench/results/policy_eval.md] [--plot bench/results/policy_frontier.png]

The evaluator itself is `warmplane.services.planner.trace_eval` (the simulation in its `fleet_sim`, the
policies in `policies`, the figures in `evaluation`), shared with `warmplane evaluate-traffic`, which runs it
on Warmplane's own recorded request events. `--replicas` replicas serve the trace; a new one joins at
`--join-at` of its span, warmed by each policy beforehand, and takes the keys the ring gives it. Policies:
`none`; `seed-replay` (the last 500 distinct request chains seen fleet-wide, the seed's documents);
`top-50` (the planner's current simple policy: requests x tokens over the history, 50 items);
`peer-copy` (the most recent blocks of the replica the newcomer takes most traffic from); `warmplane`
(the planner's own path: the history before the join bucketed as the planner stores it, then
`policy.trie_from_counts` and `policy.choose_for_replica`); `warmplane-spread` (the same, planned as for a
router that is not the ring, `WARMPLANE_ROUTING__MODE=spread`, then routed by the ring: what not knowing the
router costs). All but the seed replay are held to the same token limit: `--capacity-fraction` of the
replica's KV capacity.

Per policy, for the new replica: the prefix hit ratio (cached blocks / prompt blocks) in its first minute,
first 5 minutes and everything after the join; requests with no cached block in the first 5 minutes;
prefill tokens spent warming; tokens saved (hit tokens beyond the unwarmed run's, same requests); yield =
saved / spent. `steady` is the unwarmed newcomer's hit ratio from 5 minutes after the join to the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.summary import SummaryRecorder, Table, add_summary_option, parameters_of
from warmplane.services.planner.trace_eval.evaluation import TraceResult, evaluate
from warmplane.services.planner.trace_eval.fleet_sim import load_requests
from warmplane.services.planner.trace_eval.params import EvalParams
from warmplane.services.planner.trace_eval.report import NOTES, policy_table, render, setting, targets
from warmplane.shared.mooncake_trace import TRACE_BLOCK_TOKENS
from warmplane.shared.traces import evaluated_traces


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    defaults = EvalParams()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--trace",
        type=Path,
        action="append",
        help="Mooncake JSONL (repeatable; default: the traces shipped in warmplane.shared.traces, the"
        " recorded two and the generated RAG shape)",
    )
    parser.add_argument(
        "--block-tokens", type=int, default=defaults.block_tokens, help="tokens per hash id (the traces: 512)"
    )
    parser.add_argument(
        "--trace-block-tokens",
        type=int,
        default=TRACE_BLOCK_TOKENS,
        help="the block size the trace's input lengths were recorded with (the published traces: 512;"
        " an export of `warmplane evaluate-traffic`: its --block-tokens); a smaller --block-tokens"
        " shrinks lengths with it",
    )
    parser.add_argument("--replicas", type=int, default=defaults.replicas, help="replicas before the join")
    parser.add_argument(
        "--capacity-blocks",
        type=int,
        default=defaults.capacity_blocks,
        help="KV capacity of a replica, blocks",
    )
    parser.add_argument(
        "--capacity-fraction",
        type=float,
        default=defaults.capacity_fraction,
        help="warm-set cap, share of KV",
    )
    parser.add_argument(
        "--join-at", type=float, default=defaults.join_at, help="when the newcomer joins, share of span"
    )
    parser.add_argument("--routing-depth", default="auto", help="chain depth routed by; auto: see fleet_sim")
    parser.add_argument(
        "--load-factor", type=float, default=defaults.load_factor, help="the ring's bounded-load factor"
    )
    parser.add_argument(
        "--load-window", type=float, default=defaults.load_window, help="seconds of requests counted as load"
    )
    parser.add_argument(
        "--half-life", type=float, default=defaults.half_life, help="warmplane: count half-life, s"
    )
    parser.add_argument(
        "--frequency-half-life",
        type=lambda text: None if text == "none" else float(text),
        default=defaults.frequency_half_life,
        help="warmplane: the longer half-life whose rate estimate is averaged in, s; none: only --half-life",
    )
    parser.add_argument(
        "--ramp-window", type=float, default=defaults.ramp_window, help="warmplane: ramp window, s"
    )
    parser.add_argument(
        "--min-reuse", type=float, default=defaults.min_reuse, help="warmplane: least reuse probability"
    )
    parser.add_argument(
        "--min-saved-tokens",
        type=int,
        default=defaults.min_saved_tokens,
        help="warmplane: a plan expected to save less prefill than this is issued empty",
    )
    parser.add_argument(
        "--bucket-seconds",
        type=int,
        default=defaults.bucket_seconds,
        help="warmplane: statistics bucket, s (the planner's)",
    )
    parser.add_argument(
        "--admit-after",
        type=int,
        default=defaults.admit_after,
        help="warmplane: store a chain node once this many requests passed it (2: a first-sighting filter)",
    )
    parser.add_argument(
        "--store-nodes",
        type=int,
        default=None,
        help="warmplane: the store holds at most this many chain nodes, least recently passed evicted and"
        " their counts rolled up into their parents (default: no bound)",
    )
    parser.add_argument("--output", type=Path, help="write the command, parameters and tables here")
    parser.add_argument(
        "--plot", type=Path, help="draw the frontiers here (PNG; needs matplotlib, the bench extra)"
    )
    add_summary_option(parser)
    return parser.parse_args(argv)


def params_from(args: argparse.Namespace) -> EvalParams:
    return EvalParams(
        block_tokens=args.block_tokens,
        replicas=args.replicas,
        capacity_blocks=args.capacity_blocks,
        capacity_fraction=args.capacity_fraction,
        join_at=args.join_at,
        routing_depth=None if args.routing_depth == "auto" else int(args.routing_depth),
        load_factor=args.load_factor,
        load_window=args.load_window,
        half_life=args.half_life,
        frequency_half_life=args.frequency_half_life,
        ramp_window=args.ramp_window,
        min_reuse=args.min_reuse,
        min_saved_tokens=args.min_saved_tokens,
        bucket_seconds=args.bucket_seconds,
        admit_after=args.admit_after,
        store_nodes=args.store_nodes,
    )


def simulate(path: Path, params: EvalParams, trace_block_tokens: int) -> tuple[TraceResult, float]:
    """The trace's result and the seconds its simulation took."""
    started = time.perf_counter()
    result = evaluate(path.name, load_requests(path, params.block_tokens, trace_block_tokens), params)
    return result, time.perf_counter() - started


def summarise(recorder: SummaryRecorder, results: Sequence[tuple[TraceResult, float]]) -> None:
    """Each trace's policy table and targets as the summary's tables and notes; the planner's own policy's
    first-minute hit ratio and yield as its figures (a simulation, without a baseline measured beside it:
    the table compares the policies on the same requests)."""
    for result, seconds in results:
        ours = result.by_policy("warmplane")
        recorder.figure(f"{result.name}: warmplane's first-minute hit ratio", ours.hit_1m, "hit ratio")
        recorder.figure(
            f"{result.name}: warmplane's first-minute hit ratio over the ceiling's",
            ours.hit_1m / result.ceiling.hit_1m if result.ceiling.hit_1m else 0.0,
            "ratio",
        )
        recorder.figure(
            f"{result.name}: warmplane's warm tokens over the ceiling's",
            ours.spent / result.ceiling.spent if result.ceiling.spent else 0.0,
            "ratio",
        )
        recorder.figure(f"{result.name}: calibration gap", result.calibration_gap, "probability")
        caption = f"{result.name}: {setting(result)}; simulated in {seconds:.1f} s."
        recorder.tables.append(Table(caption=caption, markdown="\n".join(policy_table(result))))
        recorder.notes += [f"{result.name}: {line}" for line in targets(result)]
    recorder.note(
        "A deterministic simulation, run once: no baseline is measured beside its figures, and no ratio is"
        " given beyond what the bench prints (the policies side by side in each table, and the targets)."
    )
    recorder.note(NOTES)


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        params = params_from(args)
    except ValueError as exc:
        print(f"bench.evaluate_policy: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    traces = args.trace or evaluated_traces()
    recorder = SummaryRecorder(
        bench="evaluate_policy",
        title="Warm-set policies on recorded traces: what a replica joining mid-trace gains from each",
        module="bench.evaluate_policy",
        argv=argv,
        parameters={
            **{name: value for name, value in parameters_of(args).items() if name not in ("output", "plot")},
            "trace": [str(path.name) for path in traces],
        },
        runs=1,
    )
    results = [simulate(path, params, args.trace_block_tokens) for path in traces]
    report = "\n".join(render(result, seconds) for result, seconds in results)
    print(report)
    if args.plot is not None:
        from bench.frontier_plot import picture

        picture([result for result, _ in results], args.plot)
    summarise(recorder, results)
    recorder.write(args.summary_json)
    if args.output is not None:
        command = recorder.command
        parameters = params.describe()
        if args.trace_block_tokens != TRACE_BLOCK_TOKENS:
            parameters += f", trace_block_tokens={args.trace_block_tokens}"
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(
            f"# Warm-set policies on the recorded traces\n\nCommand (from the project root):\n\n"
            f"    {command}\n\nParameters: {parameters}\n\n{NOTES}\n\n{report}"
        )


if __name__ == "__main__":
    main()
