"""`warmplane evaluate-traffic` on the recorded traces, through the real round trip: each trace replayed as
request events into an embedded broker (`warmplane replay`), then exported back and evaluated from the
topic (`warmplane evaluate-traffic`), both as processes. Run from the project root:

    python -m bench.own_traffic_eval [--trace FILE ...] [--limit N] [--block-tokens 512] \
        [--partial-blocks keep] [--output bench/results/own_traffic_eval.md]

At 512-token blocks with partial blocks kept, the export is the trace itself (the replay cuts chains
every 512 tokens and Mooncake's last block is partial), so the evaluator's table from the topic is
compared, line by line, with the evaluator run on the file directly: equal unless the broker's
partitions reorder requests of the same millisecond (requests are keyed by root prefix).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from warmplane.services.planner.trace_eval.evaluation import evaluate
from warmplane.services.planner.trace_eval.fleet_sim import requests_from_trace
from warmplane.services.planner.trace_eval.params import EvalParams
from warmplane.services.planner.trace_eval.report import policy_table
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.mooncake_trace import read_trace
from warmplane.shared.traces import shipped_traces

WARMPLANE = str(Path(sys.executable).with_name("warmplane"))
TIMEOUT_S = 1800


def run(env: dict[str, str], *args: str) -> tuple[str, float]:
    """`warmplane ARGS` with `env`; its stdout and wall seconds. Raises `RuntimeError` on a failure."""
    started = time.perf_counter()
    done = subprocess.run(
        [WARMPLANE, *args], env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"warmplane {shlex.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done.stdout, time.perf_counter() - started


def round_trip(kafka: EmbeddedKafka, trace: Path, args: argparse.Namespace) -> str:
    """Replay `trace`, evaluate it from the topic, compare with the file; one Markdown section."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("WARMPLANE_")},
        "WARMPLANE_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "WARMPLANE_KAFKA__TOPIC_PREFIX": f"own-{uuid.uuid4().hex[:8]}",
    }
    tenant = trace.stem.replace("_", "-")
    limit = ["--limit", str(args.limit)] if args.limit else []
    _, replay_s = run(env, "replay", str(trace), "--tenant", tenant, "--model", "trace-model", *limit)
    evaluate_args = [
        "evaluate-traffic", "--tenant", tenant, "--model", "trace-model",
        "--block-tokens", str(args.block_tokens), "--partial-blocks", args.partial_blocks,
    ]  # fmt: skip
    report, evaluate_s = run(env, *evaluate_args)
    lines = [
        f"## {trace.name}",
        "",
        f"Replayed in {replay_s:.1f} s; `warmplane {shlex.join(evaluate_args)}` took {evaluate_s:.1f} s"
        " (reading the topic, exporting, simulating, as a process).",
        "",
        *_comparison(trace, args, report),
        "",
        # The command's own report, its headings two levels down, under the trace's.
        *("##" + line if line.startswith("#") else line for line in report.splitlines()),
        "",
    ]
    return "\n".join(lines)


def _comparison(trace: Path, args: argparse.Namespace, report: str) -> list[str]:
    if args.block_tokens != 512 or args.partial_blocks != "keep":
        return ["(Blocks differ from the trace's 512 with partial ones kept: no direct comparison.)"]
    requests = requests_from_trace(read_trace(trace, args.limit), 512)
    direct = policy_table(evaluate(trace.name, requests, EvalParams(block_tokens=512)))
    differing = [line for line in direct if line not in report]
    if not differing:
        return [
            "The evaluator's table from the topic equals, line for line, `bench.evaluate_policy`'s on the"
            " file itself (same parameters)."
        ]
    records = list(read_trace(trace, args.limit))
    roots: dict[int, set[int]] = {}
    for record in records:
        roots.setdefault(record.timestamp, set()).add(record.hash_ids[0])
    spread = sum(len(group) for group in roots.values() if len(group) > 1)
    return [
        f"{len(differing)} of the table's {len(direct)} lines differ from the evaluator on the file itself."
        f" {spread:,} requests share their millisecond with requests of another root prefix, which the"
        " broker keys to other partitions, so their order among themselves is the topic's, not the"
        " file's; routing and LRU order depend on it. The file's lines:",
        "",
        *differing,
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--trace",
        type=Path,
        action="append",
        help="Mooncake JSONL (repeatable; default: the two traces shipped in warmplane.shared.traces)",
    )
    parser.add_argument("--limit", type=int, default=None, help="only the first N requests of each trace")
    parser.add_argument("--block-tokens", type=int, default=512)
    parser.add_argument("--partial-blocks", choices=("drop", "keep"), default="keep")
    parser.add_argument("--output", type=Path)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir, EmbeddedKafka(Path(workdir) / "kafka") as kafka:
        sections = [round_trip(kafka, trace, args) for trace in args.trace or shipped_traces()]
    text = "\n".join(
        [
            "# What warming would buy, from Warmplane's own events: the recorded traces, round trip",
            "",
            "Command (from the project root):",
            "",
            f"    {shlex.join(['python', '-m', 'bench.own_traffic_eval', *argv])}",
            "",
            *sections,
        ]
    )
    print(text)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)


if __name__ == "__main__":
    main()
