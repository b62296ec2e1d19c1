"""Where the gateway's added latency goes, without vLLM: quick, low-noise A/B runs for its serving path.

    python -m bench.gateway_profile app   [--requests 5000] [--stream] [--cprofile]
    python -m bench.gateway_profile stack [--requests 3000] [--py-spy OUT.txt] [--python PATH]
                                          [--base-python PATH]

`app` calls the gateway's ASGI app directly (no sockets), its replica a canned in-memory answer with
usage: the CPU the serving path itself spends per request (routing, decoding, the upstream body,
events, metrics, the ASGI response), in microseconds. `--cprofile` prints where it goes.

`stack` runs what the real benchmark runs, with a stub in vLLM's place: a stub replica (a raw asyncio
HTTP server in its own process, `bench/gateway_stub.py`, answering at once), the embedded broker, and the
gateway as its own process (`python -m warmplane.services.gateway`, uvloop when installed). A
keep-alive raw-socket client sends the bench's body `--requests` times to the stub directly and through
the gateway, interleaved; the added p50 is the gateway's median minus the stub's. `--py-spy OUT` samples
the gateway process meanwhile (py-spy must be on the PATH or beside this Python) and writes collapsed
stacks to OUT, then prints the frames holding the most samples. `--base-python` adds a second
gateway run by another interpreter (a virtualenv with another checkout installed), interleaved: the
before/after that a busy machine still allows. `vllm-router` (`--router`, found by default) runs over the
same stub too: the two routers' added latency, with no engine competing for the cores. `--python` picks
the first one's. CPU per request is read from /proc; on a loaded VM it counts waits for the CPU too, so
compare it only within a run.
`bench.gateway_bench` remains the measure the issue's targets are stated in: this one isolates the
gateway from the engine's noise.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import msgspec
from pydantic import SecretStr

from bench.cpu_time import process_cpu_seconds
from bench.gateway_bench import KEY, gateway_process, router_process
from bench.gateway_stub import ANSWER, BODY, MODEL, USAGE, RawClient, stub_process
from warmplane.services.gateway.app import bootstrap
from warmplane.services.gateway.membership import Replica, static_membership
from warmplane.services.gateway.settings import GatewaySettings
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.events import Event

STREAM = [
    b'data: {"id":"c1","choices":[{"index":0,"text":"x"}]}\n\n',
    b'data: {"id":"c1","choices":[],"usage":' + msgspec.json.encode(USAGE) + b"}\n\n",
    b"data: [DONE]\n\n",
]


class _Canned:
    """A replica's answer from memory, as `UpstreamResponse`."""

    def __init__(self, stream: bool) -> None:
        self.status = 200
        self.content_type: str | None = "text/event-stream" if stream else "application/json"
        self.resent = False
        self._chunks = STREAM if stream else [ANSWER]

    async def read(self) -> bytes:
        return b"".join(self._chunks)

    async def iter_raw(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk

    async def close(self) -> None:
        pass


class _CannedUpstream:
    async def post(self, url: str, body: bytes) -> _Canned:
        return _Canned(b'"stream":true' in body)

    async def close(self) -> None:
        pass


class _CountingSink:
    def __init__(self) -> None:
        self.count = 0

    def emit(self, event: Event) -> bool:
        self.count += 1
        return True


def _app() -> Callable[[dict[str, Any], Any, Any], Awaitable[None]]:
    settings = GatewaySettings(
        tenant_keys={"bench": [SecretStr(KEY)]}, tenant_secrets={"bench": SecretStr("bench-salt-secret")}
    )
    membership = static_membership([Replica("r0", "http://127.0.0.1:1", MODEL)])
    return bootstrap(settings, membership=membership, sink=_CountingSink(), client=_CannedUpstream()).app


async def _call(app: Any, body: bytes) -> int:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"gateway"),
            (b"authorization", f"Bearer {KEY}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8080),
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    done = asyncio.get_running_loop().create_future()
    status = 0

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await done  # as a server does: the client goes away only after the answer
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif not message.get("more_body", False) and not done.done():
            done.set_result(None)

    await app(scope, receive, send)
    return status


async def _app_run(requests: int, stream: bool, profile: cProfile.Profile | None) -> list[float]:
    app = _app()
    body = BODY.replace(b"}", b',"stream":true}', 1) if stream else BODY
    for _ in range(200):
        assert await _call(app, body) == 200
    took: list[float] = []
    if profile is not None:
        profile.enable()
    for _ in range(requests):
        started = time.perf_counter()
        await _call(app, body)
        took.append((time.perf_counter() - started) * 1e6)
    if profile is not None:
        profile.disable()
    return took


def run_app(requests: int, stream: bool, with_cprofile: bool) -> None:
    profile = cProfile.Profile() if with_cprofile else None
    took = _app_run_sync(requests, stream, profile)
    print(f"app, {'streamed' if stream else 'whole answer'}: {requests} requests, us per request")
    print(f"  p50 {statistics.median(took):.1f}  p90 {statistics.quantiles(took, n=10)[-1]:.1f}")
    if profile is not None:
        stats = pstats.Stats(profile).strip_dirs()
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(40)


def _app_run_sync(requests: int, stream: bool, profile: cProfile.Profile | None) -> list[float]:
    return asyncio.run(_app_run(requests, stream, profile))


def _gateway_pid(port: int) -> int:
    """The pid listening on `port` (the gateway's), from /proc: the bench starts it in its own group."""
    out = subprocess.run(["ss", "-Htlnp", f"sport = :{port}"], capture_output=True, text=True, check=True)
    return int(out.stdout.split("pid=")[1].split(",")[0])


def run_stack(
    requests: int,
    py_spy_out: str | None,
    pythons: dict[str, str],
    router: str | None,
    stub_delay_s: float = 0.0,
) -> None:
    """`pythons`: each gateway to measure by name, with its interpreter; py-spy samples the first;
    `router`: the vllm-router binary, measured over the same stub (None: not measured);
    `stub_delay_s`: how long the stub takes to answer."""
    with tempfile.TemporaryDirectory(prefix="warmplane-gateway-profile-") as folder, ExitStack() as stack:
        workdir = Path(folder)
        stub_url = stack.enter_context(stub_process(workdir, stub_delay_s))
        kafka = stack.enter_context(EmbeddedKafka(workdir / "kafka"))
        urls = {"stub": stub_url}
        for name, python in pythons.items():
            urls[name] = stack.enter_context(gateway_process(workdir, stub_url, MODEL, kafka, python=python))
        if router is not None:
            urls["vllm-router"] = stack.enter_context(router_process(workdir, router, stub_url))
        ports = {name: int(url.rsplit(":", 1)[1]) for name, url in urls.items()}
        clients = {name: RawClient(port) for name, port in ports.items()}
        pids = {name: _gateway_pid(ports[name]) for name in pythons}
        spy = _start_py_spy(next(iter(pids.values())), py_spy_out) if py_spy_out else None
        samples, cpu_ms = _measure(clients, pids, requests)
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
        for client in clients.values():
            client.close()
    direct = statistics.median(samples["stub"])
    print(f"stack: {requests} requests each, the stub answering after {1000 * stub_delay_s:g} ms; ms")
    for name, values in samples.items():
        p50, p90 = statistics.median(values), statistics.quantiles(values, n=10)[-1]
        cpu = "  CPU per request {:.3f} user {:.3f} system".format(*cpu_ms[name]) if name in cpu_ms else ""
        print(f"  {name:<13} p50 {p50:.3f}  p90 {p90:.3f}  added p50 {p50 - direct:.3f}{cpu}")
    if py_spy_out:
        _summarise(Path(py_spy_out))


def _measure(
    clients: dict[str, RawClient], pids: dict[str, int], requests: int
) -> tuple[dict[str, list[float]], dict[str, tuple[float, float]]]:
    """Milliseconds per request and target (the targets interleaved, 200 unmeasured rounds first),
    and each gateway's CPU (user + system, all its threads) per measured request."""
    samples: dict[str, list[float]] = {name: [] for name in clients}
    names = list(clients)
    cpu_before: dict[str, tuple[float, float]] = {}
    for i in range(requests + 200):
        if i == 200:
            cpu_before = {name: process_cpu_seconds(pid) for name, pid in pids.items()}
        for name in names[i % len(names) :] + names[: i % len(names)]:
            took = clients[name].post()
            if i >= 200:
                samples[name].append(took)
    cpu_ms = {}
    for name, pid in pids.items():
        after = process_cpu_seconds(pid)
        user, system = (1000 * (a - b) / requests for a, b in zip(after, cpu_before[name], strict=True))
        cpu_ms[name] = (user, system)
    return samples, cpu_ms


def _start_py_spy(pid: int, out: str) -> subprocess.Popen[bytes]:
    binary = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    argv = [binary, "record", "--pid", str(pid), "--rate", "2000", "--format", "raw", "--output", out]
    spy = subprocess.Popen([*argv, "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches before the measured requests start
    return spy


def _summarise(path: Path, top: int = 40) -> None:
    """Samples per frame, inclusive (each frame counted once per stack), waiting in the loop left out."""
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        frames = stack.split(";")
        # Waiting for events: asyncio's selector, or uvloop's C loop (its frame is `Runner.run`).
        if frames[-1].startswith(("select (", "EpollSelector.select (", "poll (", "Runner.run (")):
            continue
        total += int(samples)
        for frame in set(frames):
            inclusive[frame] += int(samples)
    print(f"\npy-spy: {total} busy samples; frames by inclusive share")
    for frame, count in inclusive.most_common(top):
        print(f"  {100 * count / total:5.1f}%  {frame}")


def _beside_python(name: str) -> str | None:
    path = Path(sys.executable).with_name(name)
    return str(path) if path.exists() else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["app", "stack"])
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--stream", action="store_true", help="app: a streamed answer")
    parser.add_argument("--cprofile", action="store_true", help="app: print cProfile's tables")
    parser.add_argument("--py-spy", dest="py_spy", default=None, help="stack: collapsed stacks to this file")
    parser.add_argument(
        "--python", default=sys.executable, help="stack: the gateway's interpreter (another checkout's venv)"
    )
    parser.add_argument("--base-python", help="stack: also measure a gateway run by this interpreter")
    parser.add_argument(
        "--router",
        default=shutil.which("vllm-router") or _beside_python("vllm-router"),
        help="stack: the vllm-router binary, measured over the same stub (default: found on the PATH or"
        " beside this Python; `make bench` installs it)",
    )
    parser.add_argument(
        "--stub-delay-ms",
        type=float,
        default=0.0,
        help="stack: the stub answers this long after a request, as an engine does after its prefill",
    )
    args = parser.parse_args()
    if args.mode == "app":
        run_app(args.requests or 5000, args.stream, args.cprofile)
    else:
        os.environ.setdefault("WARMPLANE_LOG_LEVEL", "WARNING")
        pythons = {"gateway": args.python}
        if args.base_python:
            pythons["gateway-base"] = args.base_python
        run_stack(args.requests or 3000, args.py_spy, pythons, args.router, args.stub_delay_ms / 1000)


if __name__ == "__main__":
    main()
