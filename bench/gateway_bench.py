"""The gateway's cost: added latency and throughput against calling the engine directly, and against
`vllm-router` (the Rust router from PyPI) on the same upstream, in the same run. Run:

    python -m bench.gateway_bench [--requests 300] [--concurrency 8] [--seconds 8] [--router PATH]
                                  [--base-python PATH]

It starts the embedded vLLM (CPU build, tiny model, one core), the embedded broker (the gateway's events
go to it, as in production), the gateway as its own process (`python -m warmplane.services.gateway`,
one static replica) and, if found (`--router`, or `vllm-router` on the PATH), `vllm-router --policy
consistent_hash` over the same engine. (1) Latency: the same short completion (`max_tokens=1`, prompt
cached after the first call) sent `--requests` times to each target in turn, one at a time, non-streamed
(whole answer) and streamed (time to the first byte). Added latency is a target's median minus the
engine's median. (2) Throughput: `--concurrency` requests in flight for `--seconds` per target.
All processes share this machine's cores: the numbers include that contention, for every target alike.
`--base-python` adds a second gateway (another checkout's, in its own virtualenv) as `gateway-base`,
interleaved with the rest: on a noisy machine the only fair before/after comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.embedded.processes import free_port, start_process, stop_process_group, wait_until
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, EmbeddedVllm, ensure_tiny_model

KEY = "sk-gateway-bench-key"
PROMPT = "def add(a, b):\n    return a + b\n" * 20


def _answers(url: str, path: str, headers: dict[str, str]) -> bool:
    try:
        return httpx.get(url + path, headers=headers, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def gateway_process(
    workdir: Path,
    replica_url: str,
    model: str,
    kafka: EmbeddedKafka,
    *,
    python: str = sys.executable,
    extra_env: dict[str, str] | None = None,
) -> Iterator[str]:
    """The gateway as its own process (run by `python`), over one static replica at `replica_url`;
    `extra_env` adds settings (the result cache's bench turns the cache on)."""
    port = free_port()
    replica = {"replica": "r0", "url": replica_url, "model": model}
    env = {
        **os.environ,
        "WARMPLANE_STATIC_REPLICAS": json.dumps([replica]),
        "WARMPLANE_TENANT_KEYS": json.dumps({"bench": [KEY]}),
        "WARMPLANE_TENANT_SECRETS": json.dumps({"bench": "bench-salt-secret"}),
        "WARMPLANE_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "WARMPLANE_GATEWAY__HTTP_HOST": "127.0.0.1",
        "WARMPLANE_GATEWAY__HTTP_PORT": str(port),
        "WARMPLANE_GATEWAY__METRICS_PORT": "0",
        "WARMPLANE_GATEWAY__BLOCK_SIZE": str(BLOCK_SIZE),
        "WARMPLANE_LOG_LEVEL": "WARNING",
        **(extra_env or {}),
    }
    argv = [python, "-m", "warmplane.services.gateway"]
    proc = start_process(argv, workdir / f"gateway-{port}.log", env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: _answers(url, "/healthz", {}), timeout_s=60, what="the gateway's /healthz", proc=proc
        )
        yield url
    finally:
        stop_process_group(proc, 10)


@contextmanager
def router_process(workdir: Path, binary: str, worker_url: str) -> Iterator[str]:
    """`vllm-router --policy consistent_hash` over the one worker at `worker_url`; its URL."""
    port = free_port()
    argv = [binary, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", worker_url]
    argv += ["--policy", "consistent_hash", "--log-level", "warning", "--prometheus-port", str(free_port())]
    proc = start_process(argv, workdir / "vllm-router.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(url, "/v1/models", {}), timeout_s=60, what="vllm-router", proc=proc)
        yield url
    finally:
        stop_process_group(proc, 10)


def _one(client: httpx.Client, body: dict[str, object], stream: bool) -> float:
    started = time.perf_counter()
    if not stream:
        response = client.post("/v1/completions", json=body)
        response.raise_for_status()
        return (time.perf_counter() - started) * 1000
    first: float | None = None
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        response.raise_for_status()
        for _ in response.iter_raw():
            first = first or time.perf_counter()
    assert first is not None, "the stream sent nothing"
    return (first - started) * 1000


def latencies(targets: dict[str, str], model: str, requests: int, stream: bool) -> dict[str, list[float]]:
    """Milliseconds per request and target, the targets interleaved so drift hits them alike."""
    body: dict[str, object] = {"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    clients = {
        name: httpx.Client(base_url=url, headers={"authorization": f"Bearer {KEY}"}, timeout=60)
        for name, url in targets.items()
    }
    samples: dict[str, list[float]] = {name: [] for name in targets}
    try:
        for i in range(requests + 20):
            names = list(clients)
            for name in names[i % len(names) :] + names[: i % len(names)]:
                took = _one(clients[name], body, stream)
                if i >= 20:  # the first calls fill the cache and the connection pools
                    samples[name].append(took)
    finally:
        for client in clients.values():
            client.close()
    return samples


async def throughput(url: str, model: str, concurrency: int, seconds: float) -> float:
    """Requests per second with `concurrency` in flight for `seconds`."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    done = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency)
    headers = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=limits) as client:

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                (await client.post("/v1/completions", json=body)).raise_for_status()
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)


def report(title: str, samples: dict[str, list[float]], recorder: SummaryRecorder) -> None:
    direct = statistics.median(samples["engine"])
    print(f"\n{title} (ms, {len(samples['engine'])} requests each)")
    print(f"{'target':<12}{'p50':>9}{'p90':>9}{'added p50':>12}")
    rows = []
    for name, values in samples.items():
        p50 = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"{name:<12}{p50:>9.2f}{p90:>9.2f}{p50 - direct:>12.2f}")
        rows.append([name, f"{p50:.2f}", f"{p90:.2f}", f"{p50 - direct:.2f}"])
    recorder.table(
        f"{title}: ms, {len(samples['engine'])} requests each.", ["target", "p50", "p90", "added p50"], rows
    )
    theirs = statistics.median(samples["vllm-router"]) - direct if "vllm-router" in samples else 0.0
    for name in ("gateway", "gateway-base"):
        if name not in samples:
            continue
        ours = statistics.median(samples[name]) - direct
        recorder.figure(
            f"{title}: {name} p50", statistics.median(samples[name]), "ms", ("engine direct p50", direct)
        )
        if theirs > 0:
            print(f"{name} added / vllm-router added: {ours / theirs:.2f}")
            recorder.figure(f"{title}: {name} added p50", ours, "ms", ("vllm-router added p50", theirs))


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--router", default=shutil.which("vllm-router"), help="the vllm-router binary")
    parser.add_argument(
        "--engine-timeout", type=float, default=300.0, help="seconds vLLM may take to start (a busy machine)"
    )
    add_summary_option(parser)
    parser.add_argument(
        "--base-python",
        help="also run the gateway with this interpreter as `gateway-base` (the Python of a virtualenv "
        "with another checkout installed, e.g. main's): an A/B comparison within one run",
    )
    return parser.parse_args()


def _targets(
    stack: ExitStack, workdir: Path, engine: EmbeddedVllm, args: argparse.Namespace
) -> dict[str, str]:
    """Each target's base URL by name, its process started on `stack`."""
    kafka = stack.enter_context(EmbeddedKafka(workdir / "kafka"))
    url, model = engine.base_url, engine.model_name
    targets = {"engine": url, "gateway": stack.enter_context(gateway_process(workdir, url, model, kafka))}
    if args.base_python:
        targets["gateway-base"] = stack.enter_context(
            gateway_process(workdir, url, model, kafka, python=args.base_python)
        )
    if args.router:
        targets["vllm-router"] = stack.enter_context(router_process(workdir, args.router, engine.base_url))
    else:
        print("vllm-router not found (pip install vllm-router, or --router PATH): engine only")
    return targets


def main() -> None:
    args = _arguments()
    recorder = SummaryRecorder(
        bench="gateway",
        title="The gateway's added latency and throughput, against the engine direct and vllm-router",
        module="bench.gateway_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=1,
    )
    with tempfile.TemporaryDirectory(prefix="warmplane-gateway-bench-") as folder, ExitStack() as stack:
        workdir = Path(folder)
        engine = stack.enter_context(
            EmbeddedVllm(
                workdir / "vllm", ensure_tiny_model(), omp_threads_bind=0, start_timeout_s=args.engine_timeout
            )
        )
        targets = _targets(stack, workdir, engine, args)
        whole = latencies(targets, engine.model_name, args.requests, stream=False)
        report("Non-streamed, whole answer", whole, recorder)
        first = latencies(targets, engine.model_name, args.requests, stream=True)
        report("Streamed, first byte", first, recorder)
        print(f"\nThroughput, {args.concurrency} in flight for {args.seconds:.0f} s (requests/s)")
        rates = {}
        for name, url in targets.items():
            rates[name] = asyncio.run(throughput(url, engine.model_name, args.concurrency, args.seconds))
            print(f"{name:<12}{rates[name]:>9.1f}")
    recorder.figure(
        "throughput through the gateway", rates["gateway"], "requests/s", ("engine direct", rates["engine"])
    )
    recorder.table(
        f"Throughput, {args.concurrency} in flight for {args.seconds:g} s.",
        ["target", "requests/s"],
        [[name, f"{rate:.1f}"] for name, rate in rates.items()],
    )
    recorder.note(
        "Latency figures are medians of one run's requests (each target's, interleaved); added p50 is a"
        " target's p50 minus the engine's. Every process shares the machine's cores, for every target alike."
    )
    if "vllm-router" not in targets:
        recorder.note("vllm-router was not found: no comparison with it in this run.")
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
