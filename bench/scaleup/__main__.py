"""Proof of value: a replica joins a busy fleet mid-replay; how fast does it answer in its first minute?

    python -m bench.scaleup [--runs 3] [--arms warmplane,gateway-cold,vllm-router-cache-aware,...]
                            [--before-s 120] [--after-s 300] [--sample 0.3] [--offset-s 1200]
                            [--output bench/results/scaleup.md] [--plot bench/results/scaleup.png]
    python -m bench.scaleup --from-raw .warmplane/scaleup/<stamp>/records.json   # the report again

Real parts only: SmolLM2-135M-Instruct served by the CPU build of vLLM (two engines, one core each: the
established replica r0 and the newcomer r1), and in front of them, per arm, Warmplane (the embedded
broker, PostgreSQL and Redis, the planner, a warmer per node, the gateway) or vllm-router. The traffic is
a slice of the conversation trace the project ships, replayed in real time as streamed chat requests whose
prefixes reproduce the trace's prefix chains (`traffic.py`), thinned by sampling conversations so that the
one established replica runs near its capacity: the moment a team scales up. `before_s` into the replay the
newcomer joins; the replay goes on for `after_s`.

Arms, run interleaved (each run's order rotated), fresh engines and parts every run:
- `warmplane`: planned, warmed at low priority, verified, gated on `/ready`, ramped in by the gateway;
- `gateway-cold`: the same gateway, the newcomer's warmer set not to warm, ramped in the same way;
- `vllm-router-cache-aware`, `vllm-router-round-robin`: vllm-router with that policy, the newcomer added
  cold as soon as its engine answers (what a team running it gets today).
Figures and windows: `figures.py`. Every run's samples are kept (`--raw`), so the report can be made again.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from pathlib import Path

import msgspec

from bench.scaleup.arms import Arm, RouterArm, WarmplaneArm
from bench.scaleup.figures import RunRecord
from bench.scaleup.report import cpu_table, headline, picture, summarise, table, targets
from bench.scaleup.run import RunSettings, calibrate, run_arm
from bench.summary import SummaryRecorder, Table, add_summary_option, parameters_of
from warmplane.services.devstack.chat_traffic import (
    Slice,
    TraceError,
    read_ordered_trace,
    replay_requests,
    vocabulary_words,
)
from warmplane.shared.embedded.vllm_engine import ensure_smollm2
from warmplane.shared.traces import trace_path

ARMS = ("warmplane", "gateway-cold", "vllm-router-cache-aware", "vllm-router-round-robin")


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--trace", type=Path, default=None, help="Mooncake JSONL (default: the shipped one)")
    parser.add_argument("--offset-s", type=float, default=1200.0, help="where in the trace the replay starts")
    parser.add_argument(
        "--sample",
        type=float,
        default=None,
        help="share of conversations replayed (default: measured, see --utilization)",
    )
    parser.add_argument(
        "--utilization",
        type=float,
        default=0.85,
        help="without --sample: the established replica's load, a share of what it serves one at a time",
    )
    parser.add_argument("--calibration-requests", type=int, default=40)
    parser.add_argument("--before-s", type=float, default=120.0, help="replay before the join")
    parser.add_argument("--after-s", type=float, default=300.0, help="replay after the join")
    parser.add_argument("--warm-seconds", type=float, default=30.0, help="the planner's prefill budget")
    parser.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=None,
        help="the engine's prefill rate the planner's budget assumes (default: measured by the calibration)",
    )
    parser.add_argument("--kv-cache-gib", type=int, default=4, help="each engine's KV cache")
    parser.add_argument("--model-dir", type=Path, default=None, help="a served model (default: SmolLM2)")
    parser.add_argument("--router", default=None, help="the vllm-router binary (default: beside python)")
    parser.add_argument("--output", type=Path, default=Path("bench/results/scaleup.md"))
    parser.add_argument("--plot", type=Path, default=Path("bench/results/scaleup.png"))
    parser.add_argument("--raw", type=Path, default=Path(".warmplane/scaleup"), help="where runs are kept")
    parser.add_argument("--from-raw", type=Path, default=None, help="only report the runs kept in this file")
    add_summary_option(parser)
    return parser.parse_args(argv)


class Kept(msgspec.Struct):
    """What a measurement keeps: the settings its report states, and every run's samples."""

    command: str
    offset_s: float
    sample: float
    before_s: float
    after_s: float
    records: list[RunRecord]
    service_s: float = 0.0
    """The calibration's mean seconds a request alone; 0 when the sample was given."""
    prefill_tokens_per_s: float = 0.0
    """The planner's assumed prefill rate, measured or given."""


def _arms(names: list[str], args: argparse.Namespace) -> list[Arm]:
    router = args.router or shutil.which("vllm-router") or str(Path(sys.executable).with_name("vllm-router"))
    made: dict[str, Arm] = {}
    for name in names:
        if name in ("warmplane", "gateway-cold"):
            made[name] = WarmplaneArm(
                warm=name == "warmplane",
                warm_seconds=args.warm_seconds,
                prefill_tokens_per_s=args.prefill_tokens_per_s,
            )
        elif name.startswith("vllm-router-"):
            if not Path(router).is_file():
                raise SystemExit(f"bench.scaleup: no vllm-router at {router} (pip install -e '.[bench]')")
            made[name] = RouterArm(router, name.removeprefix("vllm-router-").replace("-", "_"))
        else:
            raise SystemExit(f"bench.scaleup: unknown arm {name!r}; arms: {', '.join(ARMS)}")
    return list(made.values())


def _report(kept: Kept, recorder: SummaryRecorder) -> str:
    by_arm, runs = summarise(kept.records)
    target_table = targets(by_arm)
    recorder.runs = max(runs.values(), default=1)
    for name, value, base_name, base in headline(by_arm):
        recorder.figure(name, value, "s", baseline=(base_name, base))
    recorder.tables.append(Table(caption="Per arm, medians over runs", markdown=table(by_arm, runs)))
    recorder.tables.append(Table(caption="Targets (issue 15)", markdown=target_table))
    cpu = cpu_table(kept.records)
    if cpu:
        recorder.tables.append(Table(caption="CPU seconds per part over the replay, medians", markdown=cpu))
    text = (
        "# Scale-up scenario: a new replica's first minute\n\n"
        f"Command (from the project root):\n\n    {kept.command}\n\n"
        f"Replay: the conversation trace from {kept.offset_s:.0f} s, {kept.sample:.1%} of its conversations, "
        f"{kept.before_s:.0f} s before the join and {kept.after_s:.0f} s after. TTFT is the client's time to "
        "the first streamed chunk; medians over runs of each run's figure."
        + _calibration_line(kept)
        + "\n\n"
        + table(by_arm, runs)
        + "\nTargets (issue 15):\n\n"
        + target_table
        + (f"\nCPU seconds each part used over the replay (medians over runs):\n\n{cpu}" if cpu else "")
    )
    return text


def _calibration_line(kept: Kept) -> str:
    said = []
    if kept.service_s:
        said.append(f"a request alone took {kept.service_s * 1000:,.0f} ms on a fresh engine (mean)")
    if kept.prefill_tokens_per_s:
        said.append(f"the planner's budget assumed {kept.prefill_tokens_per_s:,.0f} prefill tokens/s")
    return f" Calibration: {'; '.join(said)}." if said else ""


async def _measure(args: argparse.Namespace, arms: list[Arm], stamp: Path, command: str) -> Kept:
    try:
        trace = read_ordered_trace(args.trace or trace_path())
    except TraceError as exc:
        raise SystemExit(f"bench.scaleup: {exc}") from None
    model_dir = args.model_dir or await asyncio.to_thread(ensure_smollm2)
    words = vocabulary_words(model_dir / "tokenizer.json")
    settings = RunSettings(before_s=args.before_s, kv_cache_gib=args.kv_cache_gib)
    duration = args.before_s + args.after_s
    service_s = 0.0
    if args.sample is None or args.prefill_tokens_per_s is None:
        everything = replay_requests(trace, words, Slice(args.offset_s, duration, sample=1.0))
        probe = everything[: args.calibration_requests]
        calibration = await calibrate(probe, model_dir=model_dir, settings=settings)
        service_s = calibration.service_s
        if args.sample is None:
            args.sample = calibration.sample(len(everything) / duration, args.utilization)
        if args.prefill_tokens_per_s is None:
            args.prefill_tokens_per_s = calibration.prefill_tokens_per_s
        print(
            f"calibration: {service_s * 1000:.0f} ms a request alone (mean of {calibration.requests}), "
            f"prefill {calibration.prefill_tokens_per_s:.0f} tokens/s; replaying {args.sample:.1%} of the "
            f"conversations, the planner assuming {args.prefill_tokens_per_s:.0f} prefill tokens/s"
        )
    for arm in arms:
        if isinstance(arm, WarmplaneArm):
            arm.prefill_tokens_per_s = args.prefill_tokens_per_s
    requests = replay_requests(trace, words, Slice(args.offset_s, duration, sample=args.sample))
    print(f"{len(requests)} requests over {duration:.0f} s ({len(requests) / duration:.2f}/s)")
    kept = Kept(
        command,
        args.offset_s,
        args.sample,
        args.before_s,
        args.after_s,
        [],
        service_s=service_s,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
    )
    for run in range(1, args.runs + 1):
        shift = (run - 1) % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            began = time.monotonic()
            print(f"run {run}, {arm.name}: starting", flush=True)
            record = await run_arm(arm, run, requests, model_dir=model_dir, settings=settings, keep=stamp)
            kept.records.append(record)
            (stamp / "records.json").write_bytes(msgspec.json.encode(kept))
            print(f"run {run}, {arm.name}: done in {time.monotonic() - began:.0f} s", flush=True)
    return kept


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = _arguments(argv)
    recorder = SummaryRecorder(
        bench="scaleup",
        title="Scale-up: a new replica's first minute, Warmplane vs cold vs vllm-router",
        module="bench.scaleup",
        argv=argv,
        parameters=parameters_of(args),
        runs=args.runs,
    )
    command = recorder.command
    if args.from_raw is not None:
        kept = msgspec.json.decode(args.from_raw.read_bytes(), type=Kept)
    else:
        arms = _arms([name.strip() for name in args.arms.split(",") if name.strip()], args)
        stamp = args.raw / time.strftime("%Y%m%d-%H%M%S")
        stamp.mkdir(parents=True, exist_ok=True)
        kept = asyncio.run(_measure(args, arms, stamp, command))
        print(f"runs kept in {stamp / 'records.json'}")
    text = _report(kept, recorder)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text + f"\n![TTFT around the join]({args.plot.name})\n")
    picture(kept.records, args.plot, before_s=kept.before_s, after_s=kept.after_s)
    recorder.note(f"The picture of TTFT around the join: {args.plot}; the table: {args.output}.")
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
