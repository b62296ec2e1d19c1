"""`python -m bench.report` (`make bench`): every benchmark the project keeps, one after the other, into
`bench/RESULTS.md`. Run from the project root:

    python -m bench.report [--only NAME[,NAME]] [--take NAME=SUMMARY.json] [--output bench/RESULTS.md]
                           [--logs DIR] [--list]

Each bench in `BENCHES` runs as its own process (`python -m <module> <parameters> --summary-json ...`)
with a timeout, its output in a log (`--logs`, else a temporary folder the report names); its summary
(`bench/summary.py`) becomes its section. A bench that exits non-zero, times out, or writes no summary, or
one that breaks the contract, fails: its section says so and quotes its log's tail, the headline table
says so, and the command exits 1 once the rest have run. The file is rewritten after each bench, so an
interrupted run keeps what it finished. `--only` runs some benches and replaces only their sections,
keeping the others as they were (the data is kept beside the file, `RESULTS.json`). `--take` puts in
the summary of a bench run alone (`--summary-json`) instead of running it again.

The parameters below (the benches' documented defaults, spelled out) are sized so that a full run takes
about two hours and ten minutes on a 2-core machine, 95 minutes of it the scale-up scenario; each bench's
minutes are what it took in the full report run of 2026-12-06 (2 h 9 min; `--list` prints the table).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import msgspec.structs

from bench.machine import git_commit, load_average, this_machine
from bench.report_document import Results, Run, Section, decode_results, encode_results, merge, sidecar
from bench.report_markdown import render
from bench.summary import Summary, read_summary
from warmplane.shared.embedded.processes import log_tail, start_process, stop_process_group

ROUTER = shlex.quote(os.path.relpath(Path(sys.executable).parent / "vllm-router"))
"""`vllm-router` as `pip install -e '.[bench]'` installs it beside this interpreter (from the project
root: `.venv/bin/vllm-router`)."""


@dataclass(frozen=True, slots=True)
class Bench:
    name: str
    module: str
    minutes: float
    """What it takes at these parameters on a 2-core machine (measured or estimated: the table says)."""
    timeout_minutes: float
    parameters: str
    """Its command-line arguments, as a shell would split them."""
    title: str

    @property
    def args(self) -> list[str]:
        return shlex.split(self.parameters)

    @property
    def command(self) -> str:
        return f"python -m {self.module} {self.parameters}".strip()


BENCHES = (
    # name, module, minutes, timeout minutes; parameters; title
    Bench("ingest", "bench.ingest_bench", 0.8, 25,  # measured: 51 s
          "--events 600000 --runs 3 --shape fleet --planners 1,2",
          "Planner ingestion into Postgres vs the raw consumer loop"),
    Bench("ingest_chat", "bench.ingest_bench", 1.6, 25,  # measured: 93 s
          "--events 300000 --runs 3 --shape mooncake --planners 1,2",
          "Planner ingestion of chat-shaped traffic (the conversation trace's chains): rates, CPU, bytes"),
    Bench("batch_write", "bench.batch_write_bench", 0.4, 10,  # measured: 22 s
          "--events 60000 --batch 5000 --runs 3",
          "A batch's write into Postgres by part: counts, new chain nodes, the whole, on both shapes"),
    Bench("fold", "bench.fold_bench", 0.5, 5,  # measured: 17 s
          "--events 120000 --batch 30000 --runs 5",
          "The planner's fold of a batch alone, against decoding the same events, on both shapes"),
    Bench("emitter", "bench.emitter_bench", 1.2, 15,  # measured: 70 s
          "--runs 5 --events 1000000 --calls 200000",
          "The event emitter vs raw aiokafka send_batch"),
    Bench("warm", "bench.warm_bench", 1.3, 25,  # measured: 79 s
          "--runs 3 --items 48 --item-tokens 1024 --starts 100 --replicas 100",
          "Warm speed vs peak prefill; replica start to plan latency"),
    Bench("gateway", "bench.gateway_bench", 1.1, 20,  # measured: 65 s
          f"--requests 300 --concurrency 8 --seconds 8 --router {ROUTER}",
          "Gateway added latency vs the engine and vllm-router"),
    Bench("result_cache", "bench.result_cache_bench", 0.9, 20,  # measured: 55 s
          "--requests 200 --max-tokens 16",
          "Result-cache hits vs the engine"),
    # Loaded phases past a kept read's minute of life (statistics_live_s): 30-second phases never saw it go.
    Bench("plan_latency", "bench.plan_latency_bench", 5, 20,  # measured: about 5 min
          "--starts 45 --capacity-events 200000 --load-seconds 80 --burst 1000",
          "A replica's start to its plan at the warmer, idle and at half ingestion capacity"),
    Bench("result_layers", "bench.result_layers_bench", 2.5, 30,  # measured: 148 s
          "--entries 100000 --lookups 2000 --runs 3",
          "The result cache's layers at 100,000 entries; the calibrated threshold; a paraphrase workload"),
    Bench("embedding", "bench.embedding_bench", 1.9, 10,  # measured: 117 s
          "--queries 400 --concurrency 1 16 --runs 3",  # with vLLM serving the model: 2.5 min
          "The learned embedding: worker process vs thread vs vLLM's endpoint"),
    Bench("epoch", "bench.epoch_bench", 0.5, 10,  # measured: 27 s
          "--bumps 20 --warmers 4 --gateways 4 --conversations 32",
          "Epoch propagation to every warmer and gateway"),
    Bench("broker_poll", "bench.broker_poll_bench", 3.9, 15,  # measured: 232 s
          "--runs 3 --waits 100 250 500 --warmers 2",
          "The control plane's consumers at rest: broker CPU and a hop's time, by fetch wait"),
    Bench("plan_scale", "bench.plan_scale_bench", 0.1, 10,  # measured: 7 s
          "--replicas 10 100 1000 --leaves 30000 --runs 3",
          "A fleet re-plan: one pass vs one call per replica"),
    Bench("route_scale", "bench.route_scale_bench", 0.1, 5,  # measured: 2 s
          "--replicas 4 100 1000 --requests 20000 --runs 3",
          "Gateway routing and ring builds, 4 to 1,000 replicas"),
    Bench("stats_index", "bench.stats_index_bench", 0.3, 10,  # measured: 21 s
          "--batches 400 --runs 2",
          "The statistics' BRIN index vs none"),
    Bench("statistics_read", "bench.statistics_read_bench", 3, 20,  # measured: 180 s
          "--days 1 8 31 --turns-a-day 20000 --runs 3",
          "A plan's statistics read as chat history accumulates"),
    Bench("evaluate_policy", "bench.evaluate_policy", 0.1, 5,  # measured: 5 s
          "",
          "Warm-set policies on the shipped traces"),
    Bench("store_eval", "bench.store_eval", 0.5, 5,  # measured: 28 s
          "",
          "Chat-scale stores (bounded, sighting-filtered) against today's, on the shipped traces"),
    Bench("soak", "bench.soak", 11, 30,  # measured: 646 s
          "--minutes 10 --warmup-minutes 2 --event-rate 1000 --chat-rate 2 --bump-every-s 30",
          "The control plane under steady load: memory, descriptors and tasks against the warm-up's end"),
    Bench("scaleup", "bench.scaleup", 95, 150,  # measured: 5729 s
          "--runs 3",
          "Scale-up: a new replica's first minute, Warmplane vs cold vs vllm-router"),
)  # fmt: skip

STOP_GRACE_S = 60.0
"""After a timeout, how long a bench has to stop its parts on SIGINT before its group is killed."""


def run_bench(bench: Bench, logs: Path, run_id: str) -> Section:
    """Run `bench` to its end or its timeout; its section. KeyboardInterrupt stops it, then propagates."""
    before, began = load_average(), time.monotonic()
    log, summary_path = logs / f"{bench.name}.log", logs / f"{bench.name}.json"
    summary_path.unlink(missing_ok=True)
    problem = _run(bench, log, summary_path)
    summary, problem = _summary(bench, summary_path) if not problem else (None, problem)
    return Section(
        bench=bench.name,
        run=run_id,
        status="failed" if summary is None else "ok",
        command=bench.command if summary is None else summary.command,
        seconds=time.monotonic() - began,
        load_before=before,
        load_after=load_average(),
        summary=summary,
        problem=problem,
        log_tail=log_tail(log, 16_000) if summary is None else "",
    )


def _run(bench: Bench, log: Path, summary_path: Path) -> str:
    """Run `bench` with its output in `log` and its summary to `summary_path`; what went wrong, if
    anything ("" for an exit code of 0)."""
    argv = [sys.executable, "-m", bench.module, *bench.args, "--summary-json", str(summary_path)]
    proc = start_process(argv, log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        code = proc.wait(timeout=bench.timeout_minutes * 60)
    except subprocess.TimeoutExpired:
        return f"timed out after {bench.timeout_minutes:g} minutes (stopped with SIGINT, then killed)"
    finally:  # reached on KeyboardInterrupt too: the bench's parts are stopped before the report stops
        stop_process_group(proc, STOP_GRACE_S, sig=signal.SIGINT, whole_group=False)
    return f"exited with code {code}" if code != 0 else ""


def _summary(bench: Bench, path: Path) -> tuple[Summary | None, str]:
    """The summary `bench` wrote to `path`, or None and why it cannot be used."""
    try:
        summary = read_summary(path)
    except FileNotFoundError:
        return None, "exited 0 but wrote no summary"
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        return None, f"its summary breaks the contract (bench/summary.py): {exc}"
    if summary.bench != bench.name:
        return None, f"its summary names bench {summary.bench!r}, not {bench.name!r}"
    return summary, ""


def main(argv: list[str] | None = None) -> int:
    """Run the chosen benches, rewriting the output after each; 1 if any failed, 130 if interrupted."""
    args = _arguments(argv)
    if args.list:
        for bench in BENCHES:
            took = f"{bench.minutes:>4g} min (timeout {bench.timeout_minutes:>2g})"
            print(f"{bench.name:<16} {took}  {bench.command}")
        return 0
    taken = dict(args.take)
    wanted = args.only if args.only is not None else (set() if taken else {bench.name for bench in BENCHES})
    chosen = [bench for bench in BENCHES if bench.name in wanted and bench.name not in taken]
    output: Path = args.output
    earlier = _earlier(output)
    logs: Path = args.logs or Path(tempfile.mkdtemp(prefix="warmplane-bench-report-"))
    logs.mkdir(parents=True, exist_ok=True)
    run = _new_run(sys.argv[1:] if argv is None else argv, output)
    print(
        f"bench.report: {len(chosen)} benches, about {sum(b.minutes for b in chosen):.0f} min; logs in {logs}"
    )
    by_name = {bench.name: bench for bench in BENCHES}
    sections = [taken_section(by_name[name], path, run.id) for name, path in taken.items()]
    if sections:
        earlier = _write(output, merge(earlier, Results(runs=[run], sections=sections)))
    try:
        for bench in chosen:
            print(f"  {bench.name}: running, at most {bench.timeout_minutes:g} min ({logs}/{bench.name}.log)")
            sections.append(run_bench(bench, logs, run.id))
            why = f": {sections[-1].problem}" if sections[-1].problem else ""
            print(f"  {bench.name}: {sections[-1].status} in {sections[-1].seconds:.0f} s{why}", flush=True)
            run = msgspec.structs.replace(run, finished=_now(), load_after=load_average())
            earlier = _write(output, merge(earlier, Results(runs=[run], sections=sections)))
    except KeyboardInterrupt:
        print(f"bench.report: interrupted; {output} holds the benches that finished")
        return 130
    failed = [section.bench for section in sections if section.status == "failed"]
    print(f"bench.report: wrote {output}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def _new_run(argv: list[str], output: Path) -> Run:
    """This command's run, starting now: its command line, commit, machine and load."""
    started, load = _now(), load_average()
    return Run(
        id=started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        command=shlex.join(["python", "-m", "bench.report", *argv]),
        started=started,
        finished=started,
        commit=git_commit(ignored=[output, sidecar(output)]),
        machine=this_machine(),
        load_before=load,
        load_after=load,
    )


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _write(output: Path, results: Results) -> Results:
    """Keep the registry's sections only, write the document and its data; what was written."""
    known = {bench.name for bench in BENCHES}
    results = Results(runs=results.runs, sections=[s for s in results.sections if s.bench in known])
    output.parent.mkdir(parents=True, exist_ok=True)
    sidecar(output).write_bytes(encode_results(results))
    output.write_text(render(results, [(bench.name, bench.title) for bench in BENCHES]))
    return results


def _earlier(output: Path) -> Results | None:
    """The document so far, to merge into; None if there is none. Exits if its data cannot be read: a
    run must not drop sections it did not re-run."""
    data = sidecar(output)
    if not data.exists():
        if output.exists():
            print(f"bench.report: {output} has no {data.name} beside it: its sections are not kept")
        return None
    try:
        return decode_results(data.read_bytes())
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SystemExit(
            f"bench.report: {data} cannot be read ({exc}); move it away to start afresh"
        ) from exc


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", type=_names, help="comma-separated bench names (--list shows them)")
    parser.add_argument("--output", type=Path, default=Path("bench/RESULTS.md"))
    parser.add_argument("--logs", type=Path, help="keep each bench's log and summary here")
    parser.add_argument("--list", action="store_true", help="print the benches and their parameters")
    parser.add_argument(
        "--take",
        type=_taken,
        action="append",
        default=[],
        metavar="NAME=SUMMARY.json",
        help="put in the summary a bench wrote when run alone (`--summary-json`) instead of running it, for "
        "a long bench measured at another time (repeatable; without --only nothing else is run)",
    )
    return parser.parse_args(argv)


def _taken(text: str) -> tuple[str, Path]:
    name, _, path = text.partition("=")
    if not path:
        raise argparse.ArgumentTypeError(f"expected NAME=SUMMARY.json, got {text!r}")
    _names(name)
    return name, Path(path)


def taken_section(bench: Bench, path: Path, run_id: str) -> Section:
    """The section of a summary `bench` wrote when run alone; failed if the summary cannot be used. Its
    load averages are the report's (the bench's own were not recorded)."""
    summary, problem = _summary(bench, path)
    load = load_average()
    took = 0.0 if summary is None else (summary.finished - summary.started).total_seconds()
    return Section(
        bench=bench.name,
        run=run_id,
        status="failed" if summary is None else "ok",
        command=bench.command if summary is None else summary.command,
        seconds=took,
        load_before=load,
        load_after=load,
        summary=summary,
        problem=problem,
    )


def _names(text: str) -> set[str]:
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = names - {bench.name for bench in BENCHES}
    if not names or unknown:
        known = ", ".join(bench.name for bench in BENCHES)
        raise argparse.ArgumentTypeError(f"unknown bench {sorted(unknown)}: the benches are {known}")
    return names


if __name__ == "__main__":
    sys.exit(main())
