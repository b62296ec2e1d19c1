"""What the planner's batch writes cost Postgres, by part: the whole batch, its counts alone, its new chain
nodes alone. Run:

    python -m bench.batch_write_bench [--events 60000] [--batch 5000] [--runs 3]

No broker and no consumer: the events of each shape of `bench.ingest_bench` (fleet: leaves that repeat;
mooncake: the conversation trace's chains, about 16 new chain nodes a request) are folded in batches of
`--batch` against a node cache that remembers what each batch added, as the planner's writer does, and each
batch is written with `PgIngestStore.write` (one transaction: offsets, ledger, counts, new chain nodes,
catalogue) into a fresh migrated database. Three variants, interleaved run by run: the batches as folded;
the same batches without their new chain nodes (`IngestBatch.chains` emptied: what a store keeping chains
elsewhere would write); and without their requests (the chain nodes, offsets and ledger alone). It prints
Postgres's CPU an event (its whole process tree, over the writes) and the writes' wall time an event,
medians of `--runs`: where a chat event's Postgres time goes, which `bench.ingest_bench --shape mooncake`
measures only whole.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import asyncpg

from bench.cpu_time import tree_cpu_seconds
from bench.ingest_bench import fleet_events, fresh_database, mooncake_events
from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.services.planner.core.ingest_batch import IngestBatch, RequestColumns, fold_events
from warmplane.services.planner.core.node_cache import NodeCache
from warmplane.services.planner.pg_store import PartitionSlice, PgIngestStore
from warmplane.shared.embedded import EmbeddedPostgres
from warmplane.shared.events import Event

SHAPES: dict[str, Callable[[int], list[Event]]] = {
    "mooncake": lambda count: list(mooncake_events(count)),
    "fleet": lambda count: list(fleet_events(count, seed=1)),
}
Batches = list[tuple[list[Event], IngestBatch]]


def folded(events: list[Event], size: int) -> Batches:
    """`events` folded in batches of `size`, each against the nodes the earlier ones added."""
    nodes = NodeCache(capacity=10**9)
    batches = []
    for start in range(0, len(events), size):
        chunk = events[start : start + size]
        batch = fold_events(chunk, stored_nodes=nodes.by_scope)
        nodes.add_all(batch.new_nodes, now=0.0)
        batches.append((chunk, batch))
    return batches


def without_chains(batch: IngestBatch) -> IngestBatch:
    return IngestBatch(requests=batch.requests, misses=batch.misses, catalog=batch.catalog)


def without_requests(batch: IngestBatch) -> IngestBatch:
    return IngestBatch(requests=RequestColumns(), chains=batch.chains)


VARIANTS: dict[str, Callable[[IngestBatch], IngestBatch]] = {
    "whole batch": lambda batch: batch,
    "counts alone (no chain nodes)": without_chains,
    "chain nodes alone (no counts)": without_requests,
}


async def write_all(postgres: EmbeddedPostgres, batches: Batches) -> tuple[float, float]:
    """Postgres CPU and wall seconds to write `batches` into a fresh database, an event."""
    dsn = await fresh_database(postgres)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1, init=PgIngestStore.prepare_session)
    try:
        store = PgIngestStore(pool, "bench", 60)
        offset, expected = 0, None
        cpu, began = tree_cpu_seconds(postgres.pid), time.perf_counter()
        for events, batch in batches:
            ids = [event.event_id.int for event in events]
            part = PartitionSlice("requests", 0, offset, offset + len(events) - 1, expected, ids)
            await store.write([part], batch)
            offset = expected = offset + len(events)
        wall = time.perf_counter() - began
        cpu = tree_cpu_seconds(postgres.pid) - cpu
    finally:
        await pool.close()
    return cpu / offset, wall / offset


async def main(args: argparse.Namespace, recorder: SummaryRecorder) -> None:
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as workdir, EmbeddedPostgres(Path(workdir) / "pg") as postgres:
        for shape, make in SHAPES.items():
            batches = folded(make(args.events), args.batch)
            prepared = {name: [(e, variant(b)) for e, b in batches] for name, variant in VARIANTS.items()}
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
            for _ in range(args.runs):
                for name, variant_batches in prepared.items():
                    runs[name].append(await write_all(postgres, variant_batches))
            nodes = sum(len(chain.ids) for _, batch in batches for chain in batch.chains.values())
            print(f"{shape}: {nodes / args.events:.1f} new chain nodes an event")
            whole = statistics.median(cpu for cpu, _ in runs["whole batch"]) * 1e6
            for name, measured in runs.items():
                cpu = statistics.median(c for c, _ in measured) * 1e6
                wall = statistics.median(w for _, w in measured) * 1e6
                print(f"  {name:32s} Postgres {cpu:6.2f} us an event, wall {wall:6.2f} us an event")
                rows.append([shape, name, f"{cpu:.2f}", f"{wall:.2f}", f"{cpu / whole:.2f}"])
                if name != "whole batch":
                    recorder.figure(
                        f"{shape}: Postgres CPU an event, {name}", cpu, "us", ("whole batch", whole)
                    )
            recorder.figure(f"{shape}: Postgres CPU an event, whole batch", whole, "us")
    recorder.table(
        f"Postgres CPU (its process tree) and the writes' wall time an event, medians of {args.runs} runs; "
        "the last column is the share of the whole batch's CPU.",
        ["shape", "batches written", "Postgres us an event", "wall us an event", "of the whole"],
        rows,
    )


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=60_000, help="events of each shape")
    parser.add_argument("--batch", type=int, default=5_000, help="events a batch")
    parser.add_argument("--runs", type=int, default=3)
    add_summary_option(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = _arguments(sys.argv[1:])
    summary = SummaryRecorder(
        bench="batch_write",
        title="What a batch's write costs Postgres, by part",
        module="bench.batch_write_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(arguments),
        runs=arguments.runs,
    )
    asyncio.run(main(arguments, summary))
    summary.write(arguments.summary_json)
