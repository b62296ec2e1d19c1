"""What indexes on `prefix_paths` cost ingestion's path inserts. Run:

    python -m bench.paths_index_bench [--prefill 300000] [--batches 300] [--rows 1000] [--runs 2]

Four tables shaped as `prefix_paths` in the embedded PostgreSQL: `plain` (its primary key, as before
migration 0012), `brin` (plus the BRIN index on `first_seen`), `anchor` (plus the B-tree on
(scope_id, anchor_id) as well: both indexes 0012 adds for the retention sweep) and `gin` (plus a GIN
index on `ids`, which would let a plan's statistics read find the row holding a prefix at once: tried,
and not adopted for its insert cost, four times that of `anchor`, architecture.md says more). Each is
filled with `--prefill` chat-shaped rows (random 63-bit ids, as prefix hashes are; a dozen new ids a
row; each row anchored at an earlier row's leaf), then batches of `--rows` such rows are inserted as
`warmplane_ingest_events` inserts them (unnest, ORDER BY the key, ON CONFLICT DO NOTHING), to each
table in rotating order, `first_seen` advancing with the batches. The first tenth are not timed. Prints
each table's median and mean per batch and per row, and the ratios to `plain`: a GIN index defers its
entries to a pending list and merges them in bursts, which only the mean counts.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.shared.embedded import EmbeddedPostgres

TABLE = """
CREATE TABLE {name} (
    scope_id integer NOT NULL, leaf_id bigint NOT NULL, anchor_id bigint, first_depth integer NOT NULL,
    ids bigint[] NOT NULL, tokens integer[] NOT NULL, first_seen timestamptz NOT NULL,
    PRIMARY KEY (scope_id, leaf_id)
)
"""
INDEXES = {
    "plain": (),
    "brin": ("CREATE INDEX ON brin USING brin (first_seen)",),
    "anchor": (
        "CREATE INDEX ON anchor USING brin (first_seen)",
        "CREATE INDEX ON anchor (scope_id, anchor_id)",
    ),
    "gin": (
        "CREATE INDEX ON gin USING brin (first_seen)",
        "CREATE INDEX ON gin (scope_id, anchor_id)",
        "CREATE INDEX ON gin USING gin (ids)",
    ),
}
INSERT = """
INSERT INTO {name} (scope_id, leaf_id, anchor_id, first_depth, ids, tokens, first_seen)
SELECT u.scope, u.leaf, u.anchor, u.depth, u.ids::bigint[], u.tokens::integer[], u.seen
FROM unnest($1::integer[], $2::bigint[], $3::bigint[], $4::integer[], $5::text[], $6::text[],
            $7::timestamptz[]) AS u(scope, leaf, anchor, depth, ids, tokens, seen)
ORDER BY 1, 2
ON CONFLICT DO NOTHING
"""


class ChatShape:
    """Rows of chat turns: each anchored at an earlier turn's leaf (a root row now and then)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._leaves: list[tuple[int, int, int]] = []

    def rows(self, count: int, seen: datetime) -> list[list[object]]:
        """`count` rows as the insert's columns."""
        rng = self._rng
        rows: list[tuple[object, ...]] = []
        for _ in range(count):
            scope, anchor, depth = rng.randint(1, 20), None, 0
            if self._leaves and rng.random() > 0.02:
                scope, anchor, depth = self._leaves[rng.randrange(len(self._leaves))]
            ids = [rng.getrandbits(63) for _ in range(rng.randint(4, 20))]
            self._leaves.append((scope, ids[-1], depth + len(ids)))
            tokens = range(16, 16 * len(ids) + 1, 16)
            rows.append((scope, ids[-1], anchor, depth, _array(ids), _array(tokens), seen))
        return [list(column) for column in zip(*rows, strict=True)]


def _array(values: Iterable[int]) -> str:
    return "{" + ",".join(map(str, values)) + "}"


async def one_run(
    dsn: str, prefill: int, batches: int, rows: int, seed: int
) -> dict[str, tuple[float, float]]:
    """Median and mean seconds per batch for each table, on fresh tables (a GIN index defers its
    entries to a pending list and merges them in bursts: the mean counts the bursts)."""
    connection = await asyncpg.connect(dsn)
    try:
        started = datetime.now(UTC) - timedelta(days=40)
        shape = ChatShape(seed)
        filler = shape.rows(prefill, started)
        for name, indexes in INDEXES.items():
            await connection.execute(f"DROP TABLE IF EXISTS {name}")
            await connection.execute(TABLE.format(name=name))
            for index in indexes:
                await connection.execute(index)
            await connection.execute(INSERT.format(name=name), *filler)
            await connection.execute(f"VACUUM ANALYZE {name}")
        took: dict[str, list[float]] = {name: [] for name in INDEXES}
        names = list(INDEXES)
        for batch in range(batches):
            columns = shape.rows(rows, started + timedelta(seconds=batch))
            turn = batch % len(names)
            for name in names[turn:] + names[:turn]:
                began = time.perf_counter()
                await connection.execute(INSERT.format(name=name), *columns)
                if batch >= batches // 10:
                    took[name].append(time.perf_counter() - began)
        figures = {
            name: (statistics.median(values), statistics.mean(values)) for name, values in took.items()
        }
        plain = figures["plain"]
        for name, (median, mean) in figures.items():
            print(
                f"  {name:<6} median {1000 * median:7.2f} ms a batch, {1e6 * median / rows:5.2f} us a row,"
                f" / plain {median / plain[0]:.3f}; mean {1e6 * mean / rows:5.2f} us a row,"
                f" / plain {mean / plain[1]:.3f}"
            )
        return figures
    finally:
        await connection.close()


async def main(prefill: int, batches: int, rows: int, runs: int, recorder: SummaryRecorder) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="warmplane-paths-index-") as folder,
        EmbeddedPostgres(Path(folder)) as postgres,
    ):
        ratios: dict[str, list[float]] = {"brin": [], "anchor": [], "gin": []}
        anchor_us: list[float] = []
        gin_us: list[float] = []
        per_run: list[dict[str, tuple[float, float]]] = []
        for run in range(runs):
            print(f"run {run + 1}:")
            figures = await one_run(postgres.asyncpg_dsn, prefill, batches, rows, seed=run)
            per_run.append(figures)
            for name, values in ratios.items():
                values.append(figures[name][1] / figures["plain"][1])
            anchor_us.append(1e6 * (figures["anchor"][0] - figures["brin"][0]) / rows)
            gin_us.append(1e6 * (figures["gin"][1] - figures["anchor"][1]) / rows)
        for name, values in ratios.items():
            print(
                f"median over {runs} runs of the mean ratio {name} / plain: {statistics.median(values):.3f}"
            )
        print(f"the B-tree on anchors adds, median over runs: {statistics.median(anchor_us):.2f} us a row")
        print(f"the GIN index on ids adds, mean, median over runs: {statistics.median(gin_us):.2f} us a row")
    _summarise(recorder, per_run, ratios, rows)
    recorder.figure("the B-tree on anchors adds (median a batch)", statistics.median(anchor_us), "us a row")
    recorder.figure("the GIN index on ids adds (mean a batch)", statistics.median(gin_us), "us a row")


def _summarise(
    recorder: SummaryRecorder,
    per_run: list[dict[str, tuple[float, float]]],
    ratios: dict[str, list[float]],
    rows: int,
) -> None:
    """The bench's figures as its summary: each index's mean insert cost a row against `plain`'s."""
    plain = statistics.median(1e6 * figures["plain"][1] / rows for figures in per_run)
    for name, values in ratios.items():
        mean = statistics.median(1e6 * figures[name][1] / rows for figures in per_run)
        recorder.figure(
            f"insert into `{name}`, mean a row",
            mean,
            "us",
            ("`plain` (primary key only)", plain),
            statistics.median(values),
        )
    recorder.note(
        "Ratios are the median over runs of each run's mean / plain's mean (the mean counts a GIN index's"
        " merges of its pending list). Tables: plain = the primary key; brin = plus the BRIN index on"
        " first_seen; anchor = plus the B-tree on (scope_id, anchor_id), both of migration 0012; gin = plus"
        " a GIN index on ids (tried, not adopted)."
    )
    recorder.table(
        "Each run's median and mean microseconds a row inserted, by table.",
        ["run", "table", "median us a row", "mean us a row"],
        [
            [run + 1, name, f"{1e6 * median / rows:.2f}", f"{1e6 * mean / rows:.2f}"]
            for run, figures in enumerate(per_run)
            for name, (median, mean) in figures.items()
        ],
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prefill", type=int, default=300_000)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=2)
    add_summary_option(parser)
    args = parser.parse_args()
    recorder = SummaryRecorder(
        bench="paths_index",
        title="Ingestion's path inserts into prefix_paths with the retention sweep's indexes, against none",
        module="bench.paths_index_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=args.runs,
    )
    asyncio.run(main(args.prefill, args.batches, args.rows, args.runs, recorder))
    recorder.write(args.summary_json)
