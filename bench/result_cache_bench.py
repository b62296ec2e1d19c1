"""What the gateway's result cache saves: a request answered by the engine against the same request
answered from the cache (L1, the gateway's memory) and an alike one (semantic tier), through the same
gateway, in one run. Run from the project root:

    python -m bench.result_cache_bench [--requests 200] [--max-tokens 16]

It starts the embedded vLLM (CPU build, tiny model, one core), the broker, Redis and Postgres (migrated:
the semantic tier's `result_queries`), and the gateway as its own process with
`WARMPLANE_RESULT_CACHE__ENABLED` and `__SEMANTIC` on. Each round sends three greedy chat requests, in
turn: `engine` (a fresh question: `Cache-Control: no-cache` skips the lookup, so the engine answers,
its prompt prefix cached after the first round), `l1` (a question asked before: answered from the
gateway's memory, which keeping the answer filled), `semantic` (a question asked before, in capitals
and without its question mark: a different exact key, answered through the pgvector search). Reported:
each kind's p50 and p90 in ms, and the engine's p50 over each hit kind's. All processes share this
machine's cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.gateway_bench import KEY, gateway_process
from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.shared import migrate
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres, EmbeddedRedis
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm, ensure_tiny_model

SYSTEM = "You are a helpful assistant for a travel company. Answer in one short sentence. " * 8


def body(model: str, question: str, max_tokens: int) -> dict[str, object]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}


def timed(client: httpx.Client, payload: dict[str, object], expect: str, **headers: str) -> float:
    started = time.perf_counter()
    response = client.post("/v1/chat/completions", json=payload, headers=headers)
    took = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    if response.headers.get("x-warmplane-cache") != expect:
        raise RuntimeError(f"expected {expect}, the gateway said {response.headers.get('x-warmplane-cache')}")
    return took


def rounds(url: str, model: str, requests: int, max_tokens: int) -> dict[str, list[float]]:
    """Milliseconds per kind; the question of round i is new in round i, so nothing is found by chance."""
    samples: dict[str, list[float]] = {"engine": [], "l1": [], "semantic": []}
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {KEY}"}, timeout=120) as client:
        for i in range(requests):
            question = f"Which trains run from station {i} to the airport before nine in the morning?"
            asked = body(model, question, max_tokens)
            samples["engine"].append(timed(client, asked, "miss", **{"cache-control": "no-cache"}))
            samples["l1"].append(timed(client, asked, "l1"))
            alike = body(model, question.upper().rstrip("?"), max_tokens)
            samples["semantic"].append(timed(client, alike, "semantic"))
    return samples


def report(samples: dict[str, list[float]], recorder: SummaryRecorder) -> None:
    engine = statistics.median(samples["engine"])
    print(f"\nGreedy chat requests through the gateway (ms, {len(samples['engine'])} each)")
    print(f"{'answered by':<12}{'p50':>9}{'p90':>9}{'engine p50 / p50':>18}")
    rows = []
    for name, values in samples.items():
        p50 = statistics.median(values)
        print(f"{name:<12}{p50:>9.2f}{statistics.quantiles(values, n=10)[-1]:>9.2f}{engine / p50:>18.1f}")
        rows.append(
            [name, f"{p50:.2f}", f"{statistics.quantiles(values, n=10)[-1]:.2f}", f"{engine / p50:.1f}"]
        )
        if name != "engine":
            recorder.figure(
                f"{name} hit p50", p50, "ms", ("answered by the engine, p50", engine), engine / p50
            )
    recorder.table(
        f"Greedy chat requests through the gateway, ms, {len(samples['engine'])} of each kind.",
        ["answered by", "p50", "p90", "engine p50 / p50"],
        rows,
    )
    recorder.note(
        "The ratio is the engine's p50 over the hit's, as the bench prints it: how many times faster a hit"
        " is answered. All processes share the machine's cores."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=16)
    add_summary_option(parser)
    args = parser.parse_args()
    recorder = SummaryRecorder(
        bench="result_cache",
        title="Requests answered from the gateway's result cache (l1, semantic), against the engine",
        module="bench.result_cache_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=1,
    )
    with tempfile.TemporaryDirectory(prefix="warmplane-result-bench-") as folder, ExitStack() as stack:
        workdir = Path(folder)
        engine = stack.enter_context(EmbeddedVllm(workdir / "vllm", ensure_tiny_model(), omp_threads_bind=0))
        kafka = stack.enter_context(EmbeddedKafka(workdir / "kafka"))
        redis = stack.enter_context(EmbeddedRedis(workdir / "redis"))
        postgres = stack.enter_context(EmbeddedPostgres(workdir / "postgres"))
        migrate.upgrade(postgres.sqlalchemy_url)
        cache = {
            "WARMPLANE_RESULT_CACHE__ENABLED": "true",
            "WARMPLANE_RESULT_CACHE__SEMANTIC": "true",
            "WARMPLANE_REDIS__URL": redis.url,
            "WARMPLANE_POSTGRES__URL": postgres.asyncpg_dsn,
        }
        gateway = gateway_process(workdir, engine.base_url, engine.model_name, kafka, extra_env=cache)
        url = stack.enter_context(gateway)
        report(rounds(url, engine.model_name, args.requests, args.max_tokens), recorder)
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
