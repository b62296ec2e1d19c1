"""Issue 19's scale path as arithmetic on measured costs: what chat traffic from a fleet asks of planners and
of Postgres. Run:

    python -m bench.scale_path [--replicas 10 100 1000] [--requests-per-replica 100] [--costs PATH]

The costs are one planner's, an event, on the chat shape (`bench.ingest_bench --shape mooncake`, the
conversation trace's chains, where almost every request adds a leaf): its CPU, Postgres's CPU meanwhile,
the write-ahead log and the bytes the tables hold. By default they are read from the `ingest_chat` section
of `bench/RESULTS.json` (`python -m bench.report --only ingest_chat`); `--costs` takes a summary JSON that
`bench.ingest_bench --summary-json` wrote. Nothing here is measured at fleet scale: each row multiplies
the costs measured at one planner's rate, so it holds while a cost an event stays flat as rates grow
(true of the planner's CPU, which scales out by partitions; Postgres's per-event cost under one planner is
a floor, not a ceiling, once many planners contend).

For each fleet size it prints the events a second, the planner cores and Postgres cores the rate needs at
`--utilization`, the WAL a second, the bytes a day, and what is kept: today's store keeps every chain
path and per-prefix count for `--retention-days` (the detail retention, `detail_retention_hours`: older
counts are summed per scope and bucket, a row a scope a minute, not counted here); the store issue 19
proposes keeps them for the window in which counts still weigh (`--window-hours`). Then the fleet size
at which one Postgres node of `--node-cores` cores and `--node-wal-mb-s` of sustained WAL stops being
enough, whichever comes first.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.services.planner.settings import IngestSettings

RESULTS = Path(__file__).with_name("RESULTS.json")
SECTION = "ingest_chat"
FIGURES = {
    "planner_us": "1 planner: its CPU an event",
    "postgres_us": "1 planner: Postgres CPU an event meanwhile",
    "wal_bytes": "Postgres WAL an event",
    "rows_written": "Postgres rows written an event",
    "stored_bytes": "Postgres bytes stored an event",
}


@dataclass(frozen=True, slots=True)
class Costs:
    """One event's cost, measured (see the module's docstring)."""

    planner_us: float
    postgres_us: float
    wal_bytes: float
    rows_written: float
    stored_bytes: float
    source: str


@dataclass(frozen=True, slots=True)
class Fleet:
    replicas: int
    requests_per_replica: float
    events_per_request: float

    @property
    def events_per_s(self) -> float:
        return self.replicas * self.requests_per_replica * self.events_per_request


@dataclass(frozen=True, slots=True)
class Sizing:
    fleet: Fleet
    planners: int
    postgres_cores: float
    rows_per_s: float
    wal_mb_s: float
    stored_gb_day: float
    kept_today_tb: float
    kept_window_gb: float


def size(
    fleet: Fleet, costs: Costs, *, utilization: float, retention_days: float, window_hours: float
) -> Sizing:
    """What `fleet` asks for at `costs`: planners (a core each) and Postgres cores, each busy at most
    `utilization`; WAL and bytes a day; what today's store keeps over `retention_days` and what the
    windowed store keeps over `window_hours`."""
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization is a share of a core, in (0, 1], got {utilization}")
    rate = fleet.events_per_s
    stored_a_day = rate * costs.stored_bytes * 86_400
    return Sizing(
        fleet=fleet,
        planners=max(1, math.ceil(rate * costs.planner_us / 1e6 / utilization)),
        postgres_cores=rate * costs.postgres_us / 1e6 / utilization,
        rows_per_s=rate * costs.rows_written,
        wal_mb_s=rate * costs.wal_bytes / 1e6,
        stored_gb_day=stored_a_day / 1e9,
        kept_today_tb=stored_a_day * retention_days / 1e12,
        kept_window_gb=stored_a_day * window_hours / 24 / 1e9,
    )


def one_node_limit(
    costs: Costs,
    *,
    requests_per_replica: float,
    events_per_request: float,
    cores: int,
    wal_mb_s: float,
    utilization: float,
) -> tuple[int, str]:
    """The most replicas one Postgres node takes, and what binds first: its cores or its WAL."""
    per_replica = requests_per_replica * events_per_request
    by_cores = cores * utilization * 1e6 / costs.postgres_us / per_replica
    by_wal = wal_mb_s * 1e6 / costs.wal_bytes / per_replica
    if by_cores <= by_wal:
        return int(by_cores), f"its {cores} cores at {utilization:.0%} ({costs.postgres_us:.1f} us an event)"
    return int(by_wal), f"{wal_mb_s:g} MB/s of WAL ({costs.wal_bytes:,.0f} bytes an event)"


def costs_from_summary(summary: Mapping[str, object], source: str) -> Costs:
    """The four figures from a bench summary (`bench/summary.py`'s contract). Raises `ValueError` naming
    a figure the summary lacks."""
    figures = summary.get("figures")
    by_name = {f["name"]: f["median"] for f in figures} if isinstance(figures, list) else {}
    missing = [name for name in FIGURES.values() if name not in by_name]
    if missing:
        raise ValueError(f"{source} lacks {', '.join(missing)} (run bench.ingest_bench --shape mooncake)")
    return Costs(**{field: float(by_name[name]) for field, name in FIGURES.items()}, source=source)


def load_costs(path: Path | None) -> Costs:
    if path is not None:
        return costs_from_summary(json.loads(path.read_text()), str(path))
    sections = json.loads(RESULTS.read_text())["sections"]
    kept = [s for s in sections if s["bench"] == SECTION and s.get("summary")]
    if not kept:
        raise ValueError(f"{RESULTS} has no {SECTION} figures: python -m bench.report --only {SECTION}")
    section = kept[-1]
    return costs_from_summary(section["summary"], f"{RESULTS.name}, {SECTION} of {section['run']}")


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--requests-per-replica", type=float, default=100.0, help="requests/s a replica")
    parser.add_argument(
        "--events-per-request",
        type=float,
        default=1.0,
        help="a request.observed each, and a prefix.missed when the leading block was not resident (chat:"
        " the system prompt, nearly always resident)",
    )
    parser.add_argument("--utilization", type=float, default=0.7, help="the most a core is kept busy")
    parser.add_argument(
        "--retention-days",
        type=float,
        default=IngestSettings().detail_retention_hours / 24,
        help="today's detail_retention_hours / 24",
    )
    parser.add_argument("--window-hours", type=float, default=2.0, help="where counts stop weighing")
    parser.add_argument("--node-cores", type=int, default=32, help="one Postgres node's cores")
    parser.add_argument("--node-wal-mb-s", type=float, default=200.0, help="its sustained WAL, MB/s")
    parser.add_argument("--costs", type=Path, default=None, help="a bench.ingest_bench summary JSON")
    add_summary_option(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _arguments(argv)
    recorder = SummaryRecorder(
        bench="scale_path",
        title="The scale path: planners, Postgres and bytes a fleet of chat traffic asks for",
        module="bench.scale_path",
        argv=argv,
        parameters=parameters_of(args),
        runs=1,
    )
    try:
        costs = load_costs(args.costs)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"bench.scale_path: {exc}") from None
    rows = []
    for replicas in args.replicas:
        fleet = Fleet(replicas, args.requests_per_replica, args.events_per_request)
        s = size(
            fleet,
            costs,
            utilization=args.utilization,
            retention_days=args.retention_days,
            window_hours=args.window_hours,
        )
        rows.append(
            [
                f"{replicas:,}",
                f"{fleet.events_per_s:,.0f}",
                s.planners,
                f"{s.postgres_cores:.1f}",
                f"{s.rows_per_s:,.0f}",
                f"{s.wal_mb_s:,.1f}",
                f"{s.stored_gb_day:,.0f}",
                f"{s.kept_today_tb:,.1f}",
                f"{s.kept_window_gb:,.0f}",
            ]
        )
    columns = [
        "replicas",
        "events/s",
        "planners",
        "Postgres cores",
        "rows written/s",
        "WAL MB/s",
        "stored GB/day",
        f"kept today, TB ({args.retention_days:g} days)",
        f"kept windowed, GB ({args.window_hours:g} h)",
    ]
    recorder.table(
        f"At {args.requests_per_replica:g} requests/s a replica and {args.events_per_request:g} event(s) a"
        f" request, cores at most {args.utilization:.0%} busy; costs from {costs.source}: planner"
        f" {costs.planner_us:.1f} us, Postgres {costs.postgres_us:.1f} us, {costs.rows_written:.2f} rows,"
        f" WAL {costs.wal_bytes:,.0f} bytes,"
        f" stored {costs.stored_bytes:,.0f} bytes an event.",
        columns,
        rows,
    )
    limit, binding = one_node_limit(
        costs,
        requests_per_replica=args.requests_per_replica,
        events_per_request=args.events_per_request,
        cores=args.node_cores,
        wal_mb_s=args.node_wal_mb_s,
        utilization=args.utilization,
    )
    recorder.figure("replicas one Postgres node takes", limit, "replicas")
    recorder.note(f"One Postgres node stops being enough past {limit:,} replicas: {binding} binds first.")
    print(recorder.tables[-1].caption)
    print(recorder.tables[-1].markdown)
    print(recorder.notes[-1])
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
