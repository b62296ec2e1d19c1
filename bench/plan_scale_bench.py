"""Choosing a fleet's warm sets: one pass for every replica against one call per replica. Run:

    python -m bench.plan_scale_bench [--replicas 10 100 1000] [--leaves 30000] [--roots 2000] [--runs 3]

A fleet re-plan (a deploy, an epoch bump, the cold-start alarm, a scale event) chooses the warm set of
every live replica of a model from one trie. This times the policy's two paths over the same trie and
replicas: `policy.choose_for_replica` once per replica (how the planner chose before: each call builds
the ring and walks the whole trie) and `policy.choose_for_replicas` once for all of them (one ring, one
walk, then each replica's own part), and checks that both give every replica the same set. The trie is
chat-shaped: `--leaves` requests over `--roots` system prompts (the routing keys at `--depth` 0), a
template each, a conversation and a turn, times spread over the last hour. Pure CPU, no parts: prints
each path's median seconds per fleet re-plan and the ratio, for each fleet size. The per-replica path is
timed on at most `--sample` replicas and scaled to the fleet (it is linear in them). First, the time
`policy.trie_from_counts` takes to build the same shape's trie from counts stored as the planner stores
them (three minute buckets a leaf), as each read of a model's statistics does.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.services.planner.policy import (
    LeafCount,
    PolicyKnobs,
    PrefixTrie,
    RingSpec,
    StoredPrefix,
    WarmBudget,
    choose_for_replica,
    choose_for_replicas,
    trie_from_counts,
)

NOW = 1_000_000.0
KNOBS = PolicyKnobs()
BUDGET = WarmBudget(tokens=2_000_000)
CAPACITY = 8_000 * 512


def chat_trie(leaves: int, roots: int, seed: int) -> PrefixTrie:
    """`leaves` requests through `roots` system prompts, 10 templates each, conversations of 3 turns,
    counted as the planner counts them (a frequency trie blended with a recency one)."""
    rng = random.Random(seed)
    frequency, recency = PrefixTrie(KNOBS.frequency_half_life_s or 600.0), PrefixTrie(KNOBS.half_life_s)
    for leaf in range(leaves):
        root = rng.randrange(roots)
        template = 10 * roots + root * 10 + rng.randrange(10)
        chain = [root, template, 100 * roots + leaf // 3, 200 * roots + leaf]
        turn = 512 * (leaf % 3)
        at = NOW - rng.random() * 3600
        for trie in (frequency, recency):
            trie.observe(chain, [1024, 1536, 2048 + turn, 3072 + turn], at)
    frequency.blend(recency)
    return frequency


def stored_counts(leaves: int, roots: int, seed: int) -> tuple[list[StoredPrefix], list[LeafCount]]:
    """The same shape as the planner stores it: each prefix once, three minute buckets a leaf."""
    rng = random.Random(seed)
    prefixes: dict[int, StoredPrefix] = {}
    counts = []
    for leaf in range(leaves):
        root = rng.randrange(roots)
        chain = [
            root,
            10 * roots + root * 10 + rng.randrange(10),
            100 * roots + leaf // 3,
            200 * roots + leaf,
        ]
        turn = 512 * (leaf % 3)
        parent = None
        for prefix, tokens in zip(chain, [1024, 1536, 2048 + turn, 3072 + turn], strict=True):
            prefixes.setdefault(prefix, StoredPrefix(prefix, parent, tokens))
            parent = prefix
        counts += [LeafCount(chain[-1], NOW - 60 * rng.randrange(60) - 30, 1) for _ in range(3)]
    return list(prefixes.values()), counts


def time_trie_from_counts(leaves: int, roots: int, runs: int) -> tuple[float, int, int]:
    """Print the median time `trie_from_counts` takes to build a model's trie, as each plan read does;
    (that median in seconds, prefixes, counts)."""
    prefixes, counts = stored_counts(leaves, roots, seed=7)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        trie, _ = trie_from_counts(prefixes, counts, NOW, KNOBS.half_life_s, KNOBS.frequency_half_life_s)
        times.append(time.perf_counter() - started)
    print(
        f"trie from stored counts: {statistics.median(times):.2f} s (median of {runs}) for {len(trie):,}"
        f" prefixes and {len(counts):,} counts"
    )
    return statistics.median(times), len(trie), len(counts)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--leaves", type=int, default=30_000)
    parser.add_argument("--roots", type=int, default=2_000, help="system prompts (routing keys at depth 0)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--depth", type=int, default=0, help="the routing depth")
    parser.add_argument("--sample", type=int, default=20, help="replicas the per-replica path is timed on")
    add_summary_option(parser)
    args = parser.parse_args()
    recorder = SummaryRecorder(
        bench="plan_scale",
        title="A fleet re-plan's warm-set choice: one pass for every replica, against one call per replica",
        module="bench.plan_scale_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=args.runs,
    )
    trie = chat_trie(args.leaves, args.roots, seed=7)
    ring = RingSpec(depth=args.depth)
    print(f"trie: {len(trie):,} prefixes from {args.leaves:,} requests; routing depth {args.depth}")
    built, prefixes, counts = time_trie_from_counts(args.leaves, args.roots, args.runs)
    recorder.figure(f"trie from stored counts ({prefixes:,} prefixes, {counts:,} counts)", built, "s")
    rows = []
    for size in args.replicas:
        members = [f"replica-{i:05d}" for i in range(size)]
        sample = members[: args.sample]
        each_s, fleet_s = [], []
        for _ in range(args.runs):
            started = time.perf_counter()
            alone = {
                replica: choose_for_replica(
                    trie,
                    NOW,
                    replica=replica,
                    members=members,
                    ring=ring,
                    budget=BUDGET,
                    kv_capacity_tokens=CAPACITY,
                    knobs=KNOBS,
                )
                for replica in sample
            }
            each_s.append((time.perf_counter() - started) / len(sample) * size)
            started = time.perf_counter()
            together = choose_for_replicas(
                trie,
                NOW,
                capacities=dict.fromkeys(members, CAPACITY),
                members=members,
                ring=ring,
                budget=BUDGET,
                knobs=KNOBS,
            )
            fleet_s.append(time.perf_counter() - started)
            if any(together[replica] != alone[replica] for replica in sample):
                raise SystemExit(f"{size} replicas: the two paths chose different sets")
        each, fleet = statistics.median(each_s), statistics.median(fleet_s)
        items = statistics.median(len(together[replica][0]) for replica in members)
        print(
            f"{size:>6,} replicas: one call per replica {each:8.2f} s, one pass {fleet:7.2f} s,"
            f" ratio {fleet / each:.3f} (median of {args.runs}; {items:.0f} items a replica)"
        )
        recorder.figure(f"one pass, {size:,} replicas", fleet, "s", ("one call per replica", each))
        rows.append([f"{size:,}", f"{each:.2f}", f"{fleet:.2f}", f"{fleet / each:.3f}", f"{items:.0f}"])
    recorder.table(
        "Seconds per fleet re-plan by fleet size (medians); the per-replica path is timed on"
        f" {args.sample} replicas and scaled to the fleet.",
        ["replicas", "one call per replica s", "one pass s", "ratio", "items a replica"],
        rows,
    )
    recorder.note(f"Trie: {len(trie):,} prefixes from {args.leaves:,} requests; routing depth {args.depth}.")
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
