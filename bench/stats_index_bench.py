"""What the BRIN index on a statistics table's `bucket` (migration 0011) costs ingestion's upserts. Run:

    python -m bench.stats_index_bench [--batches 400] [--runs 2]

Two tables shaped as `prefix_stats`, one with the index, in the embedded PostgreSQL (18: a BRIN index no
longer stops an update being HOT, which it did before 16). Batches of upserts of Zipf-distributed keys,
the bucket advancing every 20 batches as time does, go to both tables in alternating order; the first
tenth are not timed. Prints each table's median per batch, the ratio, and how many updates were HOT.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import asyncpg

from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.shared.embedded import EmbeddedPostgres

TABLE = """
CREATE TABLE {name} (
    scope_id integer NOT NULL, prefix_id bigint NOT NULL, bucket bigint NOT NULL,
    requests bigint NOT NULL DEFAULT 0, prompt_tokens bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (scope_id, prefix_id, bucket)
)
"""
UPSERT = """
INSERT INTO {name} AS s (scope_id, prefix_id, bucket, requests, prompt_tokens)
SELECT 1, k, $2, 1, 100 FROM unnest($1::bigint[]) AS k ORDER BY k
ON CONFLICT (scope_id, prefix_id, bucket)
DO UPDATE SET requests = s.requests + 1, prompt_tokens = s.prompt_tokens + 100
"""
NAMES = ("plain", "brin")


async def one_run(dsn: str, batches: int, seed: int) -> dict[str, float]:
    """Median seconds per batch for each table, on fresh tables."""
    connection = await asyncpg.connect(dsn)
    try:
        for name in NAMES:
            await connection.execute(f"DROP TABLE IF EXISTS {name}")
            await connection.execute(TABLE.format(name=name))
        await connection.execute("CREATE INDEX brin_bucket ON brin USING brin (bucket)")
        rng = random.Random(seed)
        took: dict[str, list[float]] = {name: [] for name in NAMES}
        for batch in range(batches):
            keys = sorted({int(rng.paretovariate(1.2) * 1000) for _ in range(5000)})
            for name in NAMES if batch % 2 else reversed(NAMES):
                began = time.perf_counter()
                await connection.execute(UPSERT.format(name=name), keys, batch // 20)
                if batch >= batches // 10:
                    took[name].append(time.perf_counter() - began)
        for name in NAMES:
            updated, hot = await connection.fetchrow(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = $1", name
            )
            print(
                f"  {name:<5} {1000 * statistics.median(took[name]):6.2f} ms a batch;"
                f" {hot:,} of {updated:,} updates HOT"
            )
        return {name: statistics.median(values) for name, values in took.items()}
    finally:
        await connection.close()


async def main(batches: int, runs: int, recorder: SummaryRecorder) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="warmplane-stats-index-") as folder,
        EmbeddedPostgres(Path(folder)) as postgres,
    ):
        ratios, per_run = [], []
        for run in range(runs):
            print(f"run {run + 1}:")
            medians = await one_run(postgres.asyncpg_dsn, batches, seed=run)
            ratios.append(medians["brin"] / medians["plain"])
            per_run.append(medians)
            print(f"  with / without the index: {ratios[-1]:.3f}")
        print(f"median ratio over {runs} runs: {statistics.median(ratios):.3f}")
    brin, plain = (
        statistics.median(1000 * medians[name] for medians in per_run) for name in ("brin", "plain")
    )
    recorder.figure(
        "upsert batch, BRIN index on bucket", brin, "ms", ("no index", plain), statistics.median(ratios)
    )
    recorder.note("The ratio is the median over runs of each run's with / without (as the bench prints it).")
    recorder.table(
        "Each run's median milliseconds a batch of upserts, on fresh tables.",
        ["run", "no index ms", "BRIN ms", "ratio"],
        [
            [run + 1, f"{1000 * m['plain']:.2f}", f"{1000 * m['brin']:.2f}", f"{ratio:.3f}"]
            for run, (m, ratio) in enumerate(zip(per_run, ratios, strict=True))
        ],
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--runs", type=int, default=2)
    add_summary_option(parser)
    args = parser.parse_args()
    recorder = SummaryRecorder(
        bench="stats_index",
        title="Ingestion's upserts into a statistics table with the BRIN index on its bucket, against none",
        module="bench.stats_index_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=args.runs,
    )
    asyncio.run(main(args.batches, args.runs, recorder))
    recorder.write(args.summary_json)
