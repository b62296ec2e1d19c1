"""The gateway's routing as the fleet grows: a request's `Router.route` and a model's ring builds. Run:

    python -m bench.route_scale_bench [--replicas 4 100 1000] [--requests 20000] [--runs 3]

For each fleet size, one model's replicas all ready (`static_membership`), the gateway's default ring
(128 points a replica): the median cost of one `route` over `--requests` random keys with the ring kept
(the path every request takes), and its ratio to the smallest fleet's in the same run (1.0: routing
does not grow with the fleet); the first build of the ring (hashing every replica's points and sorting
them) and a rebuild after a ramp step (a new replica's weight going up a twentieth: the sorted points
are shared, only the weights change); and one route with a request in flight on every replica (the
bounded-load count is kept by the router as requests come and go). Pure CPU, no parts.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.services.gateway.membership import Replica, static_membership
from warmplane.services.gateway.router import Router
from warmplane.services.gateway.settings import RoutingSettings
from warmplane.shared import ring_layout


def measure(size: int, requests: int, rng: random.Random) -> tuple[float, float, float, float]:
    """Seconds: a route, the ring's first build, a ramp step's rebuild, a route with all replicas busy."""
    ring_layout.clear()  # a first build starts from nothing
    names = [f"replica-{i:05d}" for i in range(size)]
    table = static_membership(Replica(name, f"http://{name}:8000", "m") for name in names[:-1])
    table.add_ready(Replica(names[-1], f"http://{names[-1]}:8000", "m", ready_at=1_000.0))
    router = Router(table, RoutingSettings(ramp_s=100.0))
    started = time.perf_counter()
    router.ring("m", 1_000.0)
    first = time.perf_counter() - started
    started = time.perf_counter()
    router.ring("m", 1_011.0)  # the newest replica's weight steps from 0.1 to 0.15
    step = time.perf_counter() - started
    keys = [rng.getrandbits(63) for _ in range(requests)]
    started = time.perf_counter()
    for key in keys:
        router.route("m", key, 1_011.0)
    route = (time.perf_counter() - started) / requests
    for replica in router.ring("m", 1_011.0)[1].values():
        router.acquire(replica)
    started = time.perf_counter()
    for key in keys[:1_000]:
        router.route("m", key, 1_011.0)
    busy = (time.perf_counter() - started) / 1_000
    return route, first, step, busy


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, nargs="+", default=[4, 100, 1000])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    add_summary_option(parser)
    args = parser.parse_args()
    recorder = SummaryRecorder(
        bench="route_scale",
        title="Gateway routing and ring builds as the fleet grows, against the smallest fleet",
        module="bench.route_scale_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=args.runs,
    )
    rng = random.Random(7)
    results = {
        size: [measure(size, args.requests, rng) for _ in range(args.runs)] for size in sorted(args.replicas)
    }
    smallest = statistics.median(run[0] for run in results[min(results)])
    print(f"median of {args.runs} runs; route ratio to {min(results):,} replicas in the same run")
    rows = []
    for size, runs in results.items():
        route, first, step, busy = (statistics.median(run[i] for run in runs) for i in range(4))
        print(
            f"{size:>6,} replicas: route {route * 1e6:6.1f} us (ratio {route / smallest:.2f}),"
            f" all busy {busy * 1e6:6.1f} us; ring first build {first * 1e3:7.1f} ms,"
            f" ramp step {step * 1e3:5.1f} ms"
        )
        if size != min(results) or len(results) == 1:
            baseline = (f"route at {min(results):,} replicas", smallest * 1e6)
            recorder.figure(f"route at {size:,} replicas", route * 1e6, "us", baseline, route / smallest)
        rows.append(
            [
                f"{size:,}",
                f"{route * 1e6:.1f}",
                f"{busy * 1e6:.1f}",
                f"{first * 1e3:.1f}",
                f"{step * 1e3:.1f}",
            ]
        )
    recorder.table(
        "Medians per fleet size: a route with the ring kept, with a request in flight on every replica, the"
        " ring's first build and a ramp step's rebuild.",
        ["replicas", "route us", "all busy us", "first build ms", "ramp step ms"],
        rows,
    )
    recorder.note("1.0: routing does not grow with the fleet (the smallest fleet is the baseline).")
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
