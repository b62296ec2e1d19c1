"""Where the result cache's learned embedding runs: a worker process against a thread of the gateway's own
process, by what the event loop feels. Run from the project root:

    python -m bench.embedding_bench [--queries 400] [--concurrency 1 16] [--runs 3] [--no-endpoint]

For each placement of all-MiniLM-L6-v2 (`embedding_worker.WorkerEmbedder`), `--queries` chat-like queries
are embedded at each `--concurrency` (that many in flight at once), while a ticker on the same event loop
sleeps 1 ms at a time and records how late it wakes: the loop's lag is what every stream the gateway relays
would wait. Reported per placement and concurrency: a query's latency (p50, p99), queries a second, the
batches formed, and the ticker's p99 lag against the same ticker on an idle loop in the same run. The
trigram embedding (`NgramEmbedder`, no model) is measured beside them as the cost floor, and, unless
`--no-endpoint`, the same model served by vLLM on `/v1/embeddings` (`OpenAiEmbedder`; the bench starts the
engine, on the same two cores): the endpoint a team can run on cores or a GPU of its own. The gateway runs
the process placement by default; this bench is why.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.services.gateway.embedders import model_folder
from warmplane.services.gateway.embedding_worker import Placement, WorkerEmbedder
from warmplane.services.gateway.openai_embeddings import OpenAiEmbedder
from warmplane.services.gateway.text_embedding import NgramEmbedder
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm

_SUBJECTS = ("password", "invoice", "capital of France", "sourdough starter", "python list sort", "VAT rate")


def queries(count: int) -> list[str]:
    """Distinct chat-like queries of 8 to 20 words."""
    return [
        f"Could you tell me how the {_SUBJECTS[n % len(_SUBJECTS)]} works in case number {n},"
        f" and what I should do {'first' if n % 2 else 'next'} to get it right?"
        for n in range(count)
    ]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def ticking(stop: asyncio.Event) -> list[float]:
    """How late (seconds) each 1 ms sleep of the loop woke, until `stop`."""
    lags: list[float] = []
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - started - 0.001)
    return lags


async def under_load(
    embed: Callable[[str], Awaitable[list[float]]], texts: list[str], concurrency: int
) -> tuple[list[float], float, list[float]]:
    """Each query's latency, the whole load's seconds, and the ticker's lags meanwhile."""
    stop = asyncio.Event()
    ticker = asyncio.create_task(ticking(stop))
    pending = iter(texts)
    latencies: list[float] = []

    async def client() -> None:
        for text in pending:
            started = time.perf_counter()
            await embed(text)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    stop.set()
    return latencies, elapsed, await ticker


async def idle_lag(seconds: float) -> list[float]:
    stop = asyncio.Event()
    ticker = asyncio.create_task(ticking(stop))
    await asyncio.sleep(seconds)
    stop.set()
    return await ticker


Row = tuple[float, float, float, float, int]
"""p50 and p99 latency (s), queries/s, p99 loop lag (s), batches."""


async def one_run(args: argparse.Namespace, endpoint: str | None) -> dict[tuple[str, int], Row]:
    """Per (placement, concurrency): p50 and p99 latency (s), queries/s, p99 lag (s), batches."""
    texts = queries(args.queries)
    out: dict[tuple[str, int], Row] = {}
    idle = await idle_lag(2.0)
    out[("idle loop", 0)] = (0.0, 0.0, 0.0, percentile(idle, 0.99), 0)
    ngram = NgramEmbedder()
    for concurrency in args.concurrency:
        latencies, elapsed, lags = await under_load(ngram.embed, texts, concurrency)
        out[("ngram", concurrency)] = _row(latencies, elapsed, lags, 0)
    placements: tuple[Placement, ...] = ("process", "thread")
    for placement in placements:
        worker = WorkerEmbedder(model_folder(), name="minilm", placement=placement)
        await worker.start()
        await worker.embed("warm the model's first call")
        try:
            for concurrency in args.concurrency:
                before = worker.batches
                latencies, elapsed, lags = await under_load(worker.embed, texts, concurrency)
                out[(placement, concurrency)] = _row(latencies, elapsed, lags, worker.batches - before)
        finally:
            await worker.close()
    if endpoint is not None:
        remote = OpenAiEmbedder(endpoint, "minilm", timeout_s=60.0)
        await remote.start()
        try:
            for concurrency in args.concurrency:
                before = remote.batches
                latencies, elapsed, lags = await under_load(remote.embed, texts, concurrency)
                out[("endpoint", concurrency)] = _row(latencies, elapsed, lags, remote.batches - before)
        finally:
            await remote.close()
    return out


def _row(latencies: list[float], elapsed: float, lags: list[float], batches: int) -> Row:
    return (
        percentile(latencies, 0.5),
        percentile(latencies, 0.99),
        len(latencies) / elapsed,
        percentile(lags, 0.99) if lags else 0.0,
        batches,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-endpoint", action="store_true", help="leave out vLLM's /v1/embeddings")
    add_summary_option(parser)
    args = parser.parse_args()
    recorder = SummaryRecorder(
        bench="embedding",
        title="The learned embedding in a worker process vs a thread of the gateway: latency, loop lag",
        module="bench.embedding_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=args.runs,
    )
    with contextlib.ExitStack() as stack:
        endpoint = None
        if not args.no_endpoint:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="embedding-bench-")))
            engine = EmbeddedVllm(
                workdir, model_folder(), served_model_name="minilm", pooling=True, yield_cpu=False
            )
            endpoint = stack.enter_context(engine).base_url
        runs = [asyncio.run(one_run(args, endpoint)) for _ in range(args.runs)]
    keys = list(runs[0])
    medians = {key: tuple(statistics.median(run[key][i] for run in runs) for i in range(5)) for key in keys}
    idle = medians[("idle loop", 0)][3]
    rows = []
    print(f"medians of {args.runs} runs; the idle loop's p99 lag: {idle * 1e3:.2f} ms")
    for (placement, concurrency), (p50, p99, rate, lag, batches) in medians.items():
        if placement == "idle loop":
            continue
        print(
            f"{placement:>8} x{concurrency:<3} p50 {p50 * 1e3:7.2f} ms  p99 {p99 * 1e3:7.2f} ms"
            f"  {rate:8.1f} q/s  loop lag p99 {lag * 1e3:6.2f} ms  batches {batches:.0f}"
        )
        rows.append(
            [
                placement,
                str(concurrency),
                f"{p50 * 1e3:.2f}",
                f"{p99 * 1e3:.2f}",
                f"{rate:.1f}",
                f"{lag * 1e3:.2f}",
                f"{batches:.0f}",
            ]
        )
    for concurrency in args.concurrency:
        process, thread = medians[("process", concurrency)], medians[("thread", concurrency)]
        recorder.figure(
            f"loop lag p99 while embedding x{concurrency}, worker process",
            process[3] * 1e3,
            "ms",
            (f"the same in a thread of the gateway's process, x{concurrency}", thread[3] * 1e3),
            process[3] / thread[3] if thread[3] else 0.0,
        )
        if ("endpoint", concurrency) in medians:
            remote = medians[("endpoint", concurrency)]
            recorder.figure(
                f"queries/s x{concurrency}, vLLM /v1/embeddings",
                remote[2],
                "queries/s",
                (f"worker process x{concurrency}", process[2]),
                remote[2] / process[2],
            )
        recorder.figure(
            f"embedding p50 x{concurrency}, worker process",
            process[0] * 1e3,
            "ms",
            ("trigram embedding (no model)", medians[("ngram", concurrency)][0] * 1e3),
            process[0] / medians[("ngram", concurrency)][0],
        )
    recorder.table(
        "Medians per placement and concurrency: a query's latency, queries a second, the event loop's p99"
        f" lag (idle: {idle * 1e3:.2f} ms) and the batches formed.",
        ["placement", "in flight", "p50 ms", "p99 ms", "queries/s", "loop lag p99 ms", "batches"],
        rows,
    )
    recorder.note(
        "A lag ratio under 1: the worker process leaves the gateway's loop freer than a thread does."
        " The embedding's own cost is shown apart from the cache's stores (the issue's L3 figure)."
    )
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
