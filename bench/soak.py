"""`python -m bench.soak`: the control plane under steady load, watched for leaks and losses.

    python -m bench.soak [--minutes 10] [--event-rate 1000] [--chat-rate 2] [--bump-every-s 30]

Real parts (the embedded broker, PostgreSQL, Redis, a tiny-model vLLM engine) and the four services as
processes of their own (`soak_fleet.py`) carry the load of `soak_load.py`: request events at a set rate
(as a fleet's gateways publish them), chats through the gateway (result cache on), the status page's reads
of the API, and an epoch bump through the API every so often (each one a plan and a warm on the replica).
Every few seconds each service's own process series are read from its `/metrics`.

What it reports, per service, against the same service at the end of the warm-up (the baseline of the same
run): resident memory, open descriptors and event-loop tasks at their highest after the warm-up. And the
ground truth of losses: every request event on the topic (the broker keeps them all) is counted once in
PostgreSQL, and none was dropped on the way. `tests/e2e/test_soak.py` runs a minute of it in CI and
asserts the bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.soak_fleet import Parts
from bench.soak_run import SoakResult, SoakShape, run_soak
from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.shared import migrate
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres, EmbeddedRedis
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm, ensure_tiny_model


@contextlib.contextmanager
def own_parts(workdir: Path) -> Iterator[Parts]:
    """The embedded broker, PostgreSQL (a migrated database), Redis and a tiny-model engine, stopped after."""
    with (
        EmbeddedKafka(workdir / "kafka") as kafka,
        EmbeddedPostgres(workdir / "postgres") as postgres,
        EmbeddedRedis(workdir / "redis") as redis,
        EmbeddedVllm(workdir / "vllm", ensure_tiny_model()) as engine,
    ):
        migrate.upgrade(postgres.sqlalchemy_url)
        yield Parts(kafka.bootstrap_servers, postgres.asyncpg_dsn, redis.url, engine)


def summarise(recorder: SummaryRecorder, result: SoakResult) -> None:
    """Each service's highest memory after the warm-up against its own at the warm-up's end, and what it
    holds at rest against the same; the ground truth of losses in a table and notes."""
    rows = []
    for name in result.readings:
        baseline, peak, rest = result.baseline(name), result.peak(name), result.rest[name]
        mib, peak_mib = baseline.rss_bytes / 2**20, peak.rss_bytes / 2**20
        recorder.figure(f"{name}: resident memory, highest after the warm-up", peak_mib, "MiB",
                        (f"{name} at the warm-up's end", mib))  # fmt: skip
        fds = f"{baseline.open_fds:.0f} / {rest.open_fds:.0f}"
        tasks = f"{baseline.loop_tasks:.0f} / {peak.loop_tasks:.0f} / {rest.loop_tasks:.0f}"
        rows.append([name, f"{mib:.1f}", f"{peak_mib:.1f}", f"{peak_mib / mib:.3f}", fds, tasks])
    recorder.table(
        "Per service: memory at the warm-up's end and at its highest after; descriptors at the warm-up's end"
        " and at rest after the load; event-loop tasks at the warm-up's end, at their highest, and at rest.",
        ["service", "RSS at warm-up end (MiB)", "RSS highest after (MiB)", "ratio", "fds", "tasks"],
        rows,
    )
    _memory_by_minute(recorder, result)
    tally = result.tally
    recorder.note(
        f"Load: {tally.emitted:,} request events ({result.sent:,} acknowledged); chats, API reads and epoch"
        f" bumps by status: {dict(tally.chats)}, {dict(tally.reads)}, {dict(tally.bumps)}; plans by state"
        f" {result.plans}."
    )
    recorder.note(
        f"Losses: {result.on_topic:,} distinct request events on the topic, {result.counted:,} counted in"
        f" PostgreSQL, {result.dropped} dropped by the emitters; exit codes at SIGTERM {result.exit_codes}."
    )


def _memory_by_minute(recorder: SummaryRecorder, result: SoakResult) -> None:
    """Each service's resident memory at the first reading of every minute: a plateau or a slope."""
    minutes = range(int(result.shape.duration_s // 60) + 1)
    rows = []
    for name, readings in result.readings.items():
        at = [next((r for r in readings if r.at_s >= 60 * m), readings[-1]) for m in minutes]
        rows.append([name, *(f"{r.rss_bytes / 2**20:.1f}" for r in at)])
    recorder.table(
        "Resident memory (MiB) of each service at each minute of the load (the warm-up included).",
        ["service", *(f"{m} min" for m in minutes)],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup-minutes", type=float, default=2.0)
    parser.add_argument("--event-rate", type=float, default=1_000.0)
    parser.add_argument("--chat-rate", type=float, default=2.0)
    parser.add_argument("--bump-every-s", type=float, default=30.0)
    add_summary_option(parser)
    args = parser.parse_args()
    shape = SoakShape(
        duration_s=args.minutes * 60, warmup_s=args.warmup_minutes * 60, event_rate=args.event_rate,
        chat_rate=args.chat_rate, bump_every_s=args.bump_every_s,
    )  # fmt: skip
    recorder = SummaryRecorder(
        bench="soak",
        title="The control plane under steady load: each service's memory, descriptors and tasks after the"
        " warm-up against its own at the warm-up's end; losses against the topic",
        module="bench.soak",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=1,
    )
    with tempfile.TemporaryDirectory(prefix="warmplane-soak-") as folder, own_parts(Path(folder)) as parts:
        result = asyncio.run(run_soak(parts, Path(folder) / "logs", shape))
    summarise(recorder, result)
    for table in recorder.tables:
        print(table.caption, table.markdown, sep="\n")
    print(*recorder.notes, sep="\n")
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
