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
and without its question mark: a different exact key, answered through the pgvector search). The answer is
kept in the background, its query's vector last: the `semantic` request is sent once that vector's row is
in Postgres, so it measures a lookup, not a race with the keep. A `semantic` request the tier does not
answer (its embedding past `embedding_timeout_s`, say) is counted, not timed. Reported: each kind's p50 and
p90 in ms, the engine's p50 over each hit kind's, and the semantic requests not answered as such. All
processes share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx

from bench.gateway_bench import KEY, gateway_process
from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.shared import migrate
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres, EmbeddedRedis
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm, ensure_tiny_model

KEEP_TIMEOUT_S = 30.0
"""A kept answer's query vector is in Postgres within this, or the bench fails (its gateway log says why)."""


@dataclass(frozen=True, slots=True)
class Rounds:
    ms: dict[str, list[float]]
    """Milliseconds per kind answered as expected: engine, l1, semantic."""
    not_semantic: Counter[str]
    """Alike questions another tier answered, by tier (`miss`: a replica)."""


SYSTEM = "You are a helpful assistant for a travel company. Answer in one short sentence. " * 8


def body(model: str, question: str, max_tokens: int) -> dict[str, object]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}


async def timed(client: httpx.AsyncClient, payload: dict[str, object], **headers: str) -> tuple[float, str]:
    """Milliseconds to the whole answer, and the tier that answered (`x-warmplane-cache`)."""
    started = time.perf_counter()
    response = await client.post("/v1/chat/completions", json=payload, headers=headers)
    took = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    return took, response.headers.get("x-warmplane-cache", "")


def expect(answered: tuple[float, str], tier: str) -> float:
    took, by = answered
    if by != tier:
        raise RuntimeError(f"expected {tier}, the gateway said {by or 'nothing'}")
    return took


async def vectors_stored(db: asyncpg.Connection, count: int, timeout_s: float = KEEP_TIMEOUT_S) -> None:
    """Until the semantic tier holds `count` query vectors (the keeps have landed)."""
    deadline = time.monotonic() + timeout_s
    while await db.fetchval("SELECT count(*) FROM result_queries") < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {count} query vectors stored after {timeout_s:.0f} s")
        await asyncio.sleep(0.005)


async def rounds(url: str, dsn: str, model: str, requests: int, max_tokens: int) -> Rounds:
    """Milliseconds per kind; the question of round i is new in round i, so nothing is found by chance."""
    out = Rounds({"engine": [], "l1": [], "semantic": []}, Counter())
    headers = {"authorization": f"Bearer {KEY}"}
    db = await asyncpg.connect(dsn)
    try:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
            for i in range(requests):
                question = f"Which trains run from station {i} to the airport before nine in the morning?"
                asked = body(model, question, max_tokens)
                out.ms["engine"].append(
                    expect(await timed(client, asked, **{"cache-control": "no-cache"}), "miss")
                )
                out.ms["l1"].append(expect(await timed(client, asked), "l1"))
                await vectors_stored(db, i + 1)
                took, by = await timed(client, body(model, question.upper().rstrip("?"), max_tokens))
                if by == "semantic":
                    out.ms["semantic"].append(took)
                else:
                    out.not_semantic[by or "nothing"] += 1
    finally:
        await db.close()
    if not out.ms["semantic"]:
        raise RuntimeError(f"no alike question was answered by the semantic tier: {dict(out.not_semantic)}")
    return out


def report(measured: Rounds, recorder: SummaryRecorder) -> None:
    samples = measured.ms
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
    missed = sum(measured.not_semantic.values())
    print(f"alike questions not answered by the semantic tier: {missed} of {len(samples['engine'])}")
    recorder.note(
        "The ratio is the engine's p50 over the hit's, as the bench prints it: how many times faster a hit"
        " is answered. All processes share the machine's cores. Alike questions not answered by the"
        f" semantic tier (not timed): {missed} of {len(samples['engine'])}"
        + (f" ({', '.join(f'{n} {by}' for by, n in measured.not_semantic.items())})." if missed else ".")
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
        measured = asyncio.run(
            rounds(url, postgres.asyncpg_dsn, engine.model_name, args.requests, args.max_tokens)
        )
        report(measured, recorder)
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
