"""Garbage-collector settings for a process that ingests events in large batches.

A planner allocates a batch's worth of short-lived objects at every fetch (records, decoded events,
their lists). With CPython's default thresholds the collector runs every 700 allocations and its
older generations walk every batch still in flight: measured in bench/ingest_bench.py at close to
half of the planner's CPU. Events hold no reference cycles, so collecting less often frees the same
memory, only later and in fewer passes.
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 100_000
GEN1_THRESHOLD = 50
GEN2_THRESHOLD = 1_000


def tune_for_batches() -> None:
    """Collect young objects every 100k allocations; move what start-up allocated out of reach."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)
