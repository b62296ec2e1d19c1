"""What a plan's statistics read costs as chat history accumulates, with and without the retention sweep.
Run:

    python -m bench.statistics_read_bench [--days 1 8 31] [--turns-a-day 20000] [--runs 3]

A plan is chosen from `PgPlanStore.statistics`: the model's chain nodes, its request counts of the
window (`WARMPLANE_PLANS__WINDOW_HOURS`, 24 h) and the catalogued prefixes; `trie_from_counts` then
builds the trie (the planner does both for each read: `plan_choice.WarmSetChooser`). This fills a
migrated database as the planner's ingestion does for chat traffic, one tenant and prompt revision:
conversations open below a shared system prompt (their first turn anchored inside the first
conversation's nodes) and each turn adds about 6 new blocks anchored at the previous turn's leaf,
`--turns-a-day` a day for each of `--days` days of history, a count per turn in its minute's bucket, and
each minute's new nodes in one `prefix_chains` row (a batch a minute). As the planner's node cache has it,
a turn's new nodes hang below the deepest node written since the cache last forgot (hourly): the system
prompt is written again every hour, which is what lets the sweep drop chain rows by age.

For each history length it reads three times, `--runs` times each (medians): first with every row kept, as
the planner kept them while per-prefix counts stayed for the whole statistics retention (the baseline);
then after the planner's retention sweep at the default settings (`pg_retention`: counts past
`detail_retention_hours` summed per scope, chain rows written before that cut and its slack deleted),
run until it deletes
nothing more, as sweeps every few minutes over those days would have left the tables; then from those
tables again, bounded to `--max-nodes` chain nodes (`PlanSettings.max_nodes`). It prints the
rows returned, the seconds of each read and of the trie build and the most memory they held at once (the
planner's for a plan), beside the nodes the trie needs (those on the chains of the leaves counted in the
window): the read's excess is their ratio.

Then, on the last history after the sweep, it starts the planner process itself on that database and an
embedded broker and reads its resident memory through the plan of a start (`bench.planner_memory`; skip it
with `--no-planner-memory`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from bench.ingest_bench import fresh_database
from bench.planner_memory import node_cache_bytes, planner_memory
from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.services.planner.pg_plans import PgPlanStore
from warmplane.services.planner.pg_retention import sweep_counts
from warmplane.services.planner.policy import LeafCount, trie_from_counts
from warmplane.services.planner.settings import IngestSettings, PlanSettings
from warmplane.shared.chain_nodes import pack_leaves, pack_runs
from warmplane.shared.embedded import EmbeddedPostgres

MODEL = "chat-model"
BUCKET_S = 60
SYSTEM_BLOCKS = 4
TURN_BLOCKS = (3, 10)
TURNS = (1, 12)
"""Blocks a turn adds and turns a conversation has (uniform): about 14 blocks a request on average, as in
the Mooncake conversation trace."""
PathRow = tuple[int, int | None, int, list[int], list[int], datetime]
"""(leaf, anchor, first_depth, ids, tokens, first_seen): a turn's new nodes, as ingestion folds them."""
Count = tuple[int, int]
"""(leaf, bucket): one request."""


def chat_history(
    days: int, turns_a_day: int, now: datetime, seed: int = 7, cache_age_s: float = 3600.0
) -> tuple[list[PathRow], list[Count]]:
    """The runs of new nodes and the counts of `days` days of conversations ending at `now`, turns spread
    evenly. As the planner's node cache has it, a run starts below the deepest node written since the
    cache last forgot (every `cache_age_s`), so the system prompt is written again each time."""
    rng = random.Random(seed)
    next_id = iter(range(10, 1 << 62)).__next__
    system = [next_id() for _ in range(SYSTEM_BLOCKS)]
    paths: list[PathRow] = []
    counts: list[Count] = []
    total = days * turns_a_day
    start = now - timedelta(days=days)
    cached: set[int] = set()
    life = -1
    turn = 0
    while turn < total:
        chain = list(system)
        for _ in range(rng.randint(*TURNS)):
            if turn == total:
                break
            seen = start + timedelta(seconds=turn * days * 86_400 / total)
            if int((seen - start).total_seconds() // cache_age_s) != life:
                life, cached = int((seen - start).total_seconds() // cache_age_s), set()
            chain += [next_id() for _ in range(rng.randint(*TURN_BLOCKS))]
            depth = len(chain) - 1
            while depth >= 0 and chain[depth] not in cached:
                depth -= 1
            ids = chain[depth + 1 :]
            anchor = chain[depth] if depth >= 0 else None
            tokens = [16 * (depth + 2 + i) for i in range(len(ids))]
            paths.append((ids[-1], anchor, depth + 1, ids, tokens, seen))
            counts.append((ids[-1], int(seen.timestamp()) // BUCKET_S))
            cached.update(ids)
            turn += 1
    return paths, counts


async def fill(dsn: str, paths: list[PathRow]) -> int:
    """The history as ingestion stores it: the chains' new nodes a row per minute of turns (a batch a
    minute, packed: `shared/chain_nodes.py`), each row with the counts of the turns whose leaves it adds;
    the chain rows written."""
    batches: dict[int, list[PathRow]] = {}
    for row in paths:
        batches.setdefault(int(row[5].timestamp()) // BUCKET_S, []).append(row)
    db = await asyncpg.connect(dsn)
    try:
        scope = await db.fetchval(
            "INSERT INTO scopes (tenant, model, prompt_rev) VALUES ('acme', $1, 'p1') RETURNING scope_id",
            MODEL,
        )
        # Every turn ends at a leaf its batch adds: its count is kept in that row (migration 0017).
        await db.copy_records_to_table(
            "prefix_chains",
            records=[
                (
                    scope,
                    rows[-1][5],
                    pack_runs((row[1], row[2], row[3], row[4]) for row in rows),
                    pack_leaves((row[0], int(row[5].timestamp()) // BUCKET_S) for row in rows),
                )
                for rows in batches.values()
            ],
            columns=["scope_id", "written_at", "nodes", "leaves"],
        )
        await db.execute("ANALYZE")
    finally:
        await db.close()
    return len(batches)


def needed_nodes(paths: list[PathRow], counts: list[Count], since_bucket: int) -> int:
    """Nodes on the chains of the leaves counted from `since_bucket` on: what the trie is built from."""
    row_of = {row[0]: row for row in paths}
    inside = {node: row for row in paths for node in row[3]}
    needed: set[int] = set()
    for leaf, bucket in counts:
        if bucket < since_bucket:
            continue
        node: int | None = leaf
        while node is not None and node not in needed:
            row = row_of.get(node) or inside[node]
            ids = row[3][: row[3].index(node) + 1]
            needed.update(ids)
            node = row[1]
    return len(needed)


async def measure(
    pool: asyncpg.Pool, since_bucket: int, now: datetime, max_nodes: int | None = None
) -> dict[str, float]:
    began = time.perf_counter()
    stats = await PgPlanStore(pool).statistics(MODEL, since_bucket, max_nodes)
    read = time.perf_counter() - began
    began = time.perf_counter()
    trie_from_counts(
        [prefix for _, prefix in stats.prefixes],
        [LeafCount(leaf, bucket * BUCKET_S + BUCKET_S / 2, n) for _, leaf, bucket, n in stats.counts],
        now.timestamp(),
        60.0,
        600.0,
    )
    return {"read": read, "build": time.perf_counter() - began, "rows": len(stats.prefixes)}


async def peak_bytes(
    pool: asyncpg.Pool, since_bucket: int, now: datetime, max_nodes: int | None = None
) -> int:
    """The most memory one read and its trie held at once (`tracemalloc`, in a run of its own: tracing
    slows what it traces)."""
    tracemalloc.start()
    try:
        await measure(pool, since_bucket, now, max_nodes)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


async def sweep(pool: asyncpg.Pool, now: datetime) -> tuple[int, int]:
    """The planner's retention sweep at the default settings (`pg_retention.sweep_counts`, as
    `app._sweep_forever` runs it), until it deletes no more chain rows; (counts summed per scope, chain rows
    deleted)."""
    ingest = IngestSettings()
    moved = deleted = 0
    while True:
        summed, _, gone = await sweep_counts(
            pool,
            now,
            detail_hours=ingest.detail_retention_hours,
            stats_hours=ingest.stats_retention_hours,
            bucket_seconds=BUCKET_S,
            chains_slack_s=2 * ingest.node_cache_max_age_s,
        )
        moved, deleted = moved + summed, deleted + gone
        if not gone:
            break
    await pool.execute("VACUUM ANALYZE prefix_chains, prefix_stats, scope_traffic")  # as autovacuum would
    return moved, deleted


async def main(args: argparse.Namespace, recorder: SummaryRecorder) -> None:
    now = datetime.now(UTC)
    since_bucket = int((now - timedelta(hours=24)).timestamp()) // BUCKET_S
    header = ["days", "chain rows", "kept", "nodes read", "needed", "excess", "read s", "trie s"]
    header += ["peak MiB", "sweep s"]
    with tempfile.TemporaryDirectory() as workdir, EmbeddedPostgres(Path(workdir) / "pg") as postgres:
        print(" ".join(f"{h:>10}" for h in header))
        table: list[list[object]] = []
        for days in args.days:
            paths, counts = chat_history(days, args.turns_a_day, now)
            dsn = await fresh_database(postgres)
            written = await fill(dsn, paths)
            needed = needed_nodes(paths, counts, since_bucket)
            del paths, counts  # a planner does not hold the history: its objects would slow every collection
            gc.collect()
            pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
            try:
                unswept = [await measure(pool, since_bucket, now) for _ in range(args.runs)]
                unswept_peak = await peak_bytes(pool, since_bucket, now)
                began = time.perf_counter()
                await sweep(pool, now)
                swept_s = time.perf_counter() - began
                kept = await pool.fetchval("SELECT count(*) FROM prefix_chains")
                swept = [await measure(pool, since_bucket, now) for _ in range(args.runs)]
                swept_peak = await peak_bytes(pool, since_bucket, now)
                bound = args.max_nodes
                capped = [await measure(pool, since_bucket, now, bound) for _ in range(args.runs)]
                capped_peak = await peak_bytes(pool, since_bucket, now, bound)
            finally:
                await pool.close()
            for label, runs, rows_kept, peak, sweep_s in (
                ("every row kept", unswept, written, unswept_peak, "-"),
                ("swept", swept, kept, swept_peak, f"{swept_s:.1f}"),
                (f"swept, max {bound:,}", capped, kept, capped_peak, "-"),
            ):
                rows = int(runs[0]["rows"])
                read = statistics.median(run["read"] for run in runs)
                build = statistics.median(run["build"] for run in runs)
                line = [
                    f"{days} ({label})", f"{written:,}", f"{rows_kept:,}", f"{rows:,}", f"{needed:,}",
                    f"{rows / needed:.2f}x", f"{read:.2f}", f"{build:.2f}", f"{peak / 2**20:.0f}", sweep_s,
                ]  # fmt: skip
                print(" ".join(f"{cell:>10}" for cell in line))
                table.append(line)
            base_read = statistics.median(run["read"] for run in unswept)
            read = statistics.median(run["read"] for run in swept)
            recorder.figure(
                f"statistics read, {days} days of history", read, "s", ("every row kept", base_read)
            )
            recorder.figure(
                f"memory of a read and its trie, {days} days of history",
                swept_peak / 2**20,
                "MiB",
                ("every row kept", unswept_peak / 2**20),
            )
            recorder.figure(
                f"memory of a read and its trie within max_nodes {bound:,}, {days} days of history",
                capped_peak / 2**20,
                "MiB",
                ("unbounded, swept", swept_peak / 2**20),
            )
            recorder.figure(
                f"memory a node read, {days} days of history",
                swept_peak / int(swept[0]["rows"]),
                "bytes",
                None,
            )
            recorder.figure(
                f"nodes read, {days} days of history",
                int(swept[0]["rows"]),
                "nodes",
                ("nodes the trie needs", needed),
            )
        if args.planner_memory:
            await whole_planner(dsn, Path(workdir), args, recorder)
    recorder.table(
        "Per history length, with every row kept and after the retention sweep: chain rows stored and kept,"
        " nodes the read returned and the trie needs, the medians of the read and the trie build, the most"
        " memory a read and its trie held at once (tracemalloc, a run of its own), and the sweeps' seconds"
        " (all of them, from the unswept tables).",
        header,
        table,
    )
    recorder.note(
        "The read's ratio is to the same read of the same history with every row kept, in the same"
        " run. The nodes' ratio is the read's excess: nodes read / nodes on the chains of the leaves"
        " counted in the window."
    )


async def whole_planner(dsn: str, workdir: Path, args: argparse.Namespace, recorder: SummaryRecorder) -> None:
    """The planner process's memory on the last history, swept (`bench.planner_memory`): at its defaults,
    whose read stops at the weight horizon (2 hours), and reading the whole 24-hour window as the reads
    above do (a frequency half-life of 2 hours), unbounded and within `--max-nodes`; a full node cache's
    beside them."""
    days, whole = args.days[-1], PlanSettings(frequency_half_life_s=7200.0)
    variants = {
        "defaults (2-hour read)": PlanSettings(),
        "24-hour read": whole.model_copy(update={"max_nodes": None}),
        f"24-hour read, max_nodes {args.max_nodes:,}": whole.model_copy(update={"max_nodes": args.max_nodes}),
    }
    measured = await planner_memory(dsn, workdir, MODEL, list(variants.values()))
    cache_size = IngestSettings().node_cache_size
    cache = node_cache_bytes(cache_size)
    mib = 2**20
    print(f"planner process, {days} days of history (MiB): up, peak, after the plan")
    rows = []
    for label, memory in zip(variants, measured, strict=True):
        rows.append([label, *(f"{value / mib:.0f}" for value in (memory.up, memory.peak, memory.after))])
        print(f"  {label:<32} " + " ".join(f"{cell:>6}" for cell in rows[-1][1:]))
        recorder.figure(
            f"planner process's peak memory planning from {days} days of history, {label}",
            memory.peak / mib,
            "MiB",
            ("the same planner after a plan without history", memory.up / mib),
        )
    print(f"  a full node cache ({cache_size:,} nodes): {cache / mib:.0f} MiB")
    recorder.figure(f"a full node cache ({cache_size:,} nodes, node_cache_size)", cache / mib, "MiB", None)
    recorder.table(
        f"The planner process (`python -m warmplane.services.planner`) on the {days}-day history after the"
        " sweep, in MiB: resident (/proc VmRSS) once it planned a start of a model with no history, its peak"
        " (VmHWM) through the plan of a start of the history's model, and what stayed after it (the kept"
        " read). At its defaults a read stops at the weight horizon; the 24-hour rows lengthen the"
        " frequency half-life to 2 hours so that it reads what the reads above read.",
        ["planner", "up", "peak", "after the plan"],
        rows,
    )
    recorder.note(
        "A planner that only plans holds an empty node cache; a full one's (tracemalloc: its sets and the"
        " ids) adds to the peak under ingestion. Its other memory is the ingestion queues, bounded by"
        " settings."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--days", type=int, nargs="+", default=[1, 8, 31])
    parser.add_argument("--turns-a-day", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--max-nodes",
        type=int,
        default=50_000,
        help="the bound of the third read of each history (WARMPLANE_PLANS__MAX_NODES)",
    )
    parser.add_argument(
        "--no-planner-memory",
        dest="planner_memory",
        action="store_false",
        help="skip the planner process's memory on the last history (`bench.planner_memory`)",
    )
    add_summary_option(parser)
    args = parser.parse_args()
    recorder = SummaryRecorder(
        bench="statistics_read",
        title="A plan's statistics read as chat history accumulates, every row kept and swept",
        module="bench.statistics_read_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=args.runs,
    )
    asyncio.run(main(args, recorder))
    recorder.write(args.summary_json)
