"""What a chat-scale store would cost the plans: the evaluator's warmplane row on each shipped trace, with
the history held as today's store holds it (every chain node) beside the variants issue 19 proposes. Run:

    python -m bench.store_eval [--store-nodes 4000 8000 16000 32000] [--admit-after 2]

Variants (`trace_eval.store_sim`): a bounded store of K nodes, the least recently passed evicted and their
counts rolled up into their parents'; a sighting filter, a node kept once N requests passed it. K is
given in nodes, as a multiple of the fleet's KV capacity (the simulated replicas after the join, each
caching `capacity_blocks`: a node older than every cache's turnover is resident nowhere), and as the
span of traffic before the join whose distinct nodes it holds. Pure CPU, deterministic: each variant
runs once beside the unbounded store on the same requests; the ratio is the variant's first-minute hit
ratio over the unbounded store's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace

from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.services.planner.trace_eval.evaluation import evaluate
from warmplane.services.planner.trace_eval.fleet_sim import Request, load_requests
from warmplane.services.planner.trace_eval.params import EvalParams
from warmplane.shared.traces import evaluated_traces


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--store-nodes", type=int, nargs="*", default=[4_000, 8_000, 16_000, 24_000, 32_000, 48_000]
    )
    parser.add_argument("--admit-after", type=int, nargs="*", default=[2])
    add_summary_option(parser)
    return parser.parse_args(argv)


def span_start(history: Sequence[Request], nodes: int) -> float:
    """When the traffic began whose distinct nodes, counted back from the end of `history`, reach `nodes`:
    what a store of that many nodes, least recently passed evicted, still holds."""
    seen: set[int] = set()
    for request in reversed(history):
        seen.update(request.chain)
        if len(seen) >= nodes:
            return request.t
    return history[0].t if history else 0.0


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _arguments(argv)
    recorder = SummaryRecorder(
        bench="store_eval",
        title="Chat-scale stores on the shipped traces: first-minute hits against today's store",
        module="bench.store_eval",
        argv=argv,
        parameters=parameters_of(args),
        runs=1,
    )
    base = EvalParams()
    fleet_kv_blocks = (base.replicas + 1) * base.capacity_blocks
    variants = [("every node (today)", base)]
    variants += [(f"{k:,} nodes", replace(base, store_nodes=k)) for k in args.store_nodes]
    variants += [(f"kept from sighting {n}", replace(base, admit_after=n)) for n in args.admit_after]
    rows = []
    for path in evaluated_traces():
        requests = load_requests(path, base.block_tokens)
        results = [(label, params, evaluate(path.name, requests, params)) for label, params in variants]
        join_t = results[0][2].join_t
        history = [r for r in requests if r.t < join_t]
        today = results[0][2].by_policy("warmplane").hit_1m
        for label, params, result in results:
            ours = result.by_policy("warmplane")
            ratio = ours.hit_1m / today if today else 0.0
            bound = params.store_nodes
            span = f"{join_t - span_start(history, bound):,.0f} s" if bound else ""
            share = f"{bound / fleet_kv_blocks:.1f}" if bound else ""
            rows.append(
                [path.name, label, share, span, f"{ours.hit_1m:.3f}", f"{ratio:.2f}", f"{ours.spent:,}"]
            )
            if params is not base:
                recorder.figure(
                    f"{path.name}, {label}: first-minute hit ratio",
                    ours.hit_1m,
                    "hit ratio",
                    baseline=("every node (today)", today),
                )
            print(f"{path.name:<26} {label:<22} {share:>5} {span:>8}  {ours.hit_1m:.3f}  x{ratio:.2f}")
    recorder.table(
        "The warmplane row's first-minute hit ratio and warm tokens per store, against today's store on the"
        f" same requests; the fleet's KV capacity is {fleet_kv_blocks:,} blocks ({base.replicas + 1} replicas"
        f" x {base.capacity_blocks:,}).",
        [
            "trace",
            "store",
            "x fleet KV capacity",
            "traffic span it holds",
            "first-minute hit ratio",
            "over today's",
            "warm tokens",
        ],
        rows,
    )
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
