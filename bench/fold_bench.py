"""The planner's fold (`core/ingest_batch.fold_events`) alone, against decoding the same events, in one
process: no broker, no Postgres. Run:

    python -m bench.fold_bench [--events 120000] [--batch 30000] [--runs 5]

On each shape of `bench.ingest_bench` (fleet: leaves that repeat; mooncake: the conversation trace's
chains under new tenants, about 16 new chain nodes a request), the events are encoded once, then each run
decodes them all (`EventCodec.decode`, what the planner's consumer does first) and folds them in batches of
`--batch` into a node cache that remembers what each batch added, as the writer's does after a commit. The
fold is the planner's own per-event work before Postgres; the decode is the raw consumer loop's, so their
ratio says how much of the planner's CPU the fold adds to what any consumer pays. Medians of `--runs`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from bench.ingest_bench import fleet_events, mooncake_events
from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.services.planner.core.ingest_batch import fold_events
from warmplane.services.planner.core.node_cache import NodeCache
from warmplane.shared.codec import EventCodec
from warmplane.shared.events import Event

SHAPES: dict[str, Callable[[int], list[Event]]] = {
    "fleet": lambda count: list(fleet_events(count, seed=1)),
    "mooncake": lambda count: list(mooncake_events(count)),
}


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=120_000, help="events of each shape")
    parser.add_argument("--batch", type=int, default=30_000, help="events a fold")
    parser.add_argument("--runs", type=int, default=5)
    add_summary_option(parser)
    return parser.parse_args(argv)


def decode_us(codec: EventCodec, encoded: list[bytes]) -> float:
    """Microseconds an event to decode `encoded`."""
    began = time.perf_counter()
    for value in encoded:
        codec.decode(value)
    return (time.perf_counter() - began) / len(encoded) * 1e6


def fold_us(events: list[Event], batch: int) -> float:
    """Microseconds an event to fold `events` in batches of `batch`, remembering each batch's new nodes."""
    nodes = NodeCache(capacity=10**9)  # never emptied: every batch folds against all that came before
    began = time.perf_counter()
    for start in range(0, len(events), batch):
        folded = fold_events(events[start : start + batch], stored_nodes=nodes.by_scope)
        nodes.add_all(folded.new_nodes, now=0.0)
    return (time.perf_counter() - began) / len(events) * 1e6


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _arguments(argv)
    recorder = SummaryRecorder(
        bench="fold",
        title="The planner's fold of a batch, against decoding the same events",
        module="bench.fold_bench",
        argv=argv,
        parameters=parameters_of(args),
        runs=args.runs,
    )
    codec = EventCodec(1 << 20)
    for shape, make in SHAPES.items():
        events = make(args.events)
        encoded = [codec.encode(event) for event in events]
        decodes, folds = [], []
        for _ in range(args.runs):
            decodes.append(decode_us(codec, encoded))
            folds.append(fold_us(events, args.batch))
        decode, fold = statistics.median(decodes), statistics.median(folds)
        print(f"{shape:<9} decode {decode:6.2f} us an event   fold {fold:6.2f} us   x{fold / decode:.2f}")
        recorder.figure(f"{shape}: fold an event", fold, "us", baseline=("decode an event", decode))
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
