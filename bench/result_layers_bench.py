"""The result cache's three layers at 100,000 entries, the learned embedding's cost apart, the calibrated
threshold on the labelled pairs, and a replayed workload with paraphrases. Run from the project root:

    python -m bench.result_layers_bench [--entries 100000] [--lookups 2000] [--runs 3]

On embedded Redis and PostgreSQL (migrated, pgvector with the HNSW index of migration 0014), one tenant's
model holds `--entries` answers in Redis and as many query vectors in one request context (the worst case
for L3: every row a candidate), the vectors random unit vectors of all-MiniLM-L6-v2's 384 dimensions, beside
the labelled pairs' real embeddings. Per run, medians and p99 of `--lookups` lookups through
`ResultCache.lookup` (what a request pays), with L1 holding all entries (L1) and with L1 off (L2, Redis); the
nearest-row search of L3 with the query's vector given (`PgQueryIndex.nearest`) and the embedding alone
(`WorkerEmbedder`, one query at a time), so the two add up to what L3 costs a request. Then, once:
the similarity threshold `warmplane calibrate-cache` chooses at precision 0.95 and 0.8 on the shipped pairs,
with its recall; and a replayed workload, every pair's first query answered and kept, then its second
asked, and every query once more word for word: the share answered by each layer, and the answers a query
got that belonged to a different question (from a near-miss's twin).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import asyncpg
import msgspec
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from bench.summary import SummaryRecorder, add_summary_option, parameters_of
from warmplane.services.cli.calibrate_cache import score_pairs
from warmplane.services.gateway.answer_record import pack
from warmplane.services.gateway.embedders import MINILM_SPACE, model_folder
from warmplane.services.gateway.embedding_worker import WorkerEmbedder
from warmplane.services.gateway.labelled_pairs import LabelledPair, read_pairs, shipped_pairs_path
from warmplane.services.gateway.metrics import GatewayMetrics
from warmplane.services.gateway.openai_request import ClientRequest, decode
from warmplane.services.gateway.result_cache import ResultCache
from warmplane.services.gateway.result_keys import Namespace, cache_query
from warmplane.services.gateway.result_lookup import answer_key
from warmplane.services.gateway.result_stores import PgQueryIndex, QueryScope, RedisAnswers, redis_client
from warmplane.services.gateway.settings import ResultCacheSettings
from warmplane.services.gateway.similarity_calibration import Calibration, calibrate
from warmplane.shared import migrate
from warmplane.shared.embedded import EmbeddedPostgres, EmbeddedRedis
from warmplane.shared.settings import RedisSettings

TENANT, MODEL = "bench", "m"
SYSTEM = "You answer in one short sentence."
_FILL = """
INSERT INTO result_queries (tenant, model, epoch, space, context, embedding, answer_key, expires_at)
SELECT $1, $2, 0, $3, $4, e::vector, k, now() + interval '1 day'
FROM unnest($5::text[], $6::text[]) AS t(e, k)
"""


def chat(question: str) -> ClientRequest:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 16,
    }
    return decode(msgspec.json.encode(body), "chat")


def answer(text: str) -> bytes:
    return msgspec.json.encode({"choices": [{"message": {"role": "assistant", "content": text}}]})


def percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def unit_vector(rng: random.Random, dimensions: int = 384) -> str:
    values = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = sum(value * value for value in values) ** 0.5
    return "[" + ",".join(f"{value / norm:.6f}" for value in values) + "]"


def new_cache(redis: RedisAnswers, index: PgQueryIndex | None, **settings: int) -> ResultCache:
    options = ResultCacheSettings(enabled=True, semantic=index is not None, lookup_timeout_s=5).model_copy(
        update=settings
    )
    return ResultCache(options, redis, index, _NO_EMBEDDER, GatewayMetrics(CollectorRegistry()))


class _NoEmbedder:
    """The exact layers never embed; the workload's cache gets the real model."""

    name = MINILM_SPACE

    async def embed(self, text: str) -> list[float]:
        raise RuntimeError("not embedded in this measurement")


_NO_EMBEDDER = _NoEmbedder()


_INDEX = "result_queries_minilm_hnsw"


async def fill(client: aioredis.Redis, pool: asyncpg.Pool, questions: list[str], rng: random.Random) -> float:
    """Every question's answer in Redis and a random vector for it in the one context; seconds taken.
    The migration's HNSW index is built once after the rows are in, as the migration's own definition:
    grown row by row it took most of the bench's time (356 s at 100,000 rows against 46 s)."""
    started = time.perf_counter()
    definition = await pool.fetchval("SELECT pg_get_indexdef($1::text::regclass)", _INDEX)
    await pool.execute(f"DROP INDEX {_INDEX}")
    namespace = Namespace(TENANT, MODEL, 0)
    context = cache_query(chat(questions[0])).context
    for start in range(0, len(questions), 2_000):
        batch = questions[start : start + 2_000]
        keys = [answer_key(namespace, cache_query(chat(q)).exact) for q in batch]
        pipe = client.pipeline(transaction=False)
        for key, question in zip(keys, batch, strict=True):
            pipe.set(key, pack(answer(question)), px=86_400_000)
        await pipe.execute()
        vectors = [unit_vector(rng) for _ in batch]
        await pool.execute(_FILL, TENANT, MODEL, MINILM_SPACE, context, vectors, keys)
    async with pool.acquire() as db:
        await db.execute("SET maintenance_work_mem = '1GB'")
        await db.execute(definition)
        await db.execute("VACUUM ANALYZE result_queries")
    return time.perf_counter() - started


async def timed_lookups(results: ResultCache, questions: list[str], tier: str) -> list[float]:
    times = []
    for question in questions:
        request = chat(question)
        started = time.perf_counter()
        found = await results.lookup(request, TENANT, 0, {})
        times.append(time.perf_counter() - started)
        if found is None or found.hit is None or found.hit.tier != tier:
            raise RuntimeError(f"expected a {tier} hit for {question!r}, got {found and found.hit}")
    return times


async def one_run(
    redis: RedisAnswers, index: PgQueryIndex, worker: WorkerEmbedder, questions: list[str], lookups: int
) -> dict[str, tuple[float, float]]:
    rng = random.Random(len(questions))
    sample = rng.sample(questions, lookups)
    l1 = new_cache(redis, None, l1_max_entries=len(questions) + 1, l1_max_bytes=1 << 30, l1_ttl_s=3600)
    for question in questions:  # every entry in L1: the LRU at its full size
        await l1.lookup(chat(question), TENANT, 0, {})
    out = {"l1": percentiles(await timed_lookups(l1, sample, "l1"))}
    l2 = new_cache(redis, None, l1_max_entries=0)
    out["l2"] = percentiles(await timed_lookups(l2, sample, "exact"))
    scope = QueryScope(Namespace(TENANT, MODEL, 0), MINILM_SPACE, cache_query(chat(questions[0])).context)
    texts = [f"How would I {question.lower()}" for question in sample[:200]]
    embed_times: list[float] = []
    search_times: list[float] = []
    vectors: list[list[float]] = []
    for text in texts:
        started = time.perf_counter()
        vector = await worker.embed(text)
        embed_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        if await index.nearest(scope, vector) is None:
            raise RuntimeError("the nearest-row search found nothing among the entries")
        search_times.append(time.perf_counter() - started)
        vectors.append(vector)
    alone_times = []
    for vector in vectors:  # the same searches again, with no embedding just before each
        started = time.perf_counter()
        await index.nearest(scope, vector)
        alone_times.append(time.perf_counter() - started)
    out["l3_search"] = percentiles(search_times)
    out["l3_search_alone"] = percentiles(alone_times)
    out["embedding"] = percentiles(embed_times)
    return out


async def workload(
    redis: RedisAnswers,
    pool: asyncpg.Pool,
    worker: WorkerEmbedder,
    pairs: list[LabelledPair],
    threshold: float,
) -> tuple[Counter[str], int, int]:
    """The replayed workload (module docstring) at `threshold`: answers by layer, wrong answers (another
    question's: right only for a pair's second query given its first's answer, when they share one),
    requests."""
    tenant = f"workload-{random.getrandbits(32):08x}"
    options = ResultCacheSettings(enabled=True, semantic=True, similarity=threshold, lookup_timeout_s=5)
    metrics = GatewayMetrics(CollectorRegistry())
    results = ResultCache(options, redis, PgQueryIndex(pool), worker, metrics)
    tiers: Counter[str] = Counter()
    wrong = requests = 0
    for pair in pairs:
        for text in (pair.a, pair.b):
            found = await results.lookup(chat(text), tenant, 0, {})
            requests += 1
            if found is None:
                tiers["miss"] += 1
            elif found.hit is None:
                tiers["miss"] += 1
                results.keep(found, answer(text))
                await results.drain(5)
            else:
                tiers[found.hit.tier] += 1
                wrong += found.hit.answer != answer(text) and not (
                    pair.same and found.hit.answer == answer(pair.a)
                )
    for pair in pairs:  # every query once more, word for word
        for text in (pair.a, pair.b):
            again = await results.lookup(chat(text), tenant, 0, {})
            requests += 1
            tiers["miss" if again is None or again.hit is None else again.hit.tier] += 1
    return tiers, wrong, requests


async def main_async(args: argparse.Namespace, recorder: SummaryRecorder) -> None:
    with tempfile.TemporaryDirectory(prefix="result-layers-") as scratch:
        workdir = Path(scratch)
        with (
            EmbeddedRedis(workdir / "redis") as redis_part,
            EmbeddedPostgres(workdir / "postgres") as postgres,
        ):
            await asyncio.to_thread(migrate.upgrade, postgres.sqlalchemy_url)
            client = redis_client(RedisSettings(url=SecretStr(redis_part.url)))
            redis = RedisAnswers(client)
            pool = await asyncpg.create_pool(postgres.asyncpg_dsn, min_size=1, max_size=4)
            worker = WorkerEmbedder(model_folder(), name=MINILM_SPACE)
            await worker.start()
            try:
                questions = [f"Explain item {n} of the catalogue, part {n % 97}" for n in range(args.entries)]
                filled_s = await fill(client, pool, questions, random.Random(7))
                print(f"filled {args.entries:,} answers and vectors in {filled_s:.0f} s")
                index = PgQueryIndex(pool)
                runs = [
                    await one_run(redis, index, worker, questions, args.lookups) for _ in range(args.runs)
                ]
                pairs = read_pairs(shipped_pairs_path())
                scored = (await score_pairs(pairs, worker)).pairs
                thresholds = {target: calibrate(scored, target) for target in (0.95, 0.8)}
                chosen = thresholds[0.8]
                replay = None
                if chosen is not None:
                    replay = await workload(redis, pool, worker, pairs, chosen.threshold)
            finally:
                await worker.close()
                await pool.close()
                await client.aclose()
    report(args, recorder, runs, thresholds, replay)


Timings = dict[str, tuple[float, float]]
"""Per measurement: p50 and p99 seconds."""
Replay = tuple[Counter[str], int, int]


def report(
    args: argparse.Namespace,
    recorder: SummaryRecorder,
    runs: list[Timings],
    thresholds: dict[float, Calibration | None],
    replay: Replay | None,
) -> None:
    medians = {
        name: tuple(statistics.median(run[name][i] for run in runs) for i in (0, 1)) for name in runs[0]
    }
    labels = {
        "l1": "L1 lookup",
        "l2": "L2 lookup (Redis)",
        "l3_search": "L3 nearest-row search",
        "l3_search_alone": "L3 nearest-row search, alone",
        "embedding": "embedding one query",
    }
    rows = []
    for name, label in labels.items():
        p50, p99 = medians[name]
        print(f"{label:>24}: p50 {p50 * 1e6:9.1f} us  p99 {p99 * 1e6:9.1f} us")
        rows.append([label, f"{p50 * 1e6:.1f}", f"{p99 * 1e6:.1f}"])
    l1, l2, search = medians["l1"], medians["l2"], medians["l3_search"]
    recorder.figure("L1 lookup p50", l1[0] * 1e6, "us", ("L2 lookup p50 (Redis)", l2[0] * 1e6), l1[0] / l2[0])
    recorder.figure("L1 lookup p99", l1[1] * 1e6, "us")
    recorder.figure(
        "L3 nearest-row search p99 (embedding apart)",
        search[1] * 1e3,
        "ms",
        ("L2 lookup p99", l2[1] * 1e3),
        search[1] / l2[1],
    )
    alone = medians["l3_search_alone"]
    recorder.figure(
        "L3 nearest-row search p99, alone",
        alone[1] * 1e3,
        "ms",
        ("right after its embedding", search[1] * 1e3),
        alone[1] / search[1],
    )
    recorder.note(
        "The L3 search is timed twice on the same vectors: right after each query's embedding, as the gateway"
        " runs it, and again alone. On two cores the embedding worker's BLAS threads have just left the"
        " caches cold and the cores contended, which the first timing includes."
    )
    recorder.figure("embedding one query p99 (worker process)", medians["embedding"][1] * 1e3, "ms")
    recorder.table(
        f"Medians of {args.runs} runs, {args.lookups:,} lookups each, at {args.entries:,} entries.",
        ["layer", "p50 us", "p99 us"],
        rows,
    )
    calibration_rows = []
    for target, chosen in thresholds.items():
        if chosen is None:
            calibration_rows.append([f"{target}", "none reaches it", "", ""])
            continue
        counts = chosen.counts
        recall = counts.recall
        print(
            f"precision >= {target}: threshold {chosen.threshold:.4f}, {counts.precision:.3f}, {recall:.3f}"
        )
        calibration_rows.append(
            [f"{target}", f"{chosen.threshold:.4f}", f"{counts.precision:.3f}", f"{recall:.3f}"]
        )
        recorder.figure(f"recall at precision >= {target} (labelled pairs)", recall, "share")
    recorder.table(
        "The threshold calibrate-cache chooses on the shipped labelled pairs (all-MiniLM-L6-v2).",
        ["target precision", "threshold", "precision", "recall"],
        calibration_rows,
    )
    if replay is not None:
        tiers, wrong, requests = replay
        hits = requests - tiers["miss"]
        print(f"workload: {requests} requests, hit ratio {hits / requests:.3f}, {dict(tiers)}, wrong {wrong}")
        recorder.figure("replayed workload with paraphrases: hit ratio", hits / requests, "share")
        recorder.figure("replayed workload: semantic-only hit ratio", tiers["semantic"] / requests, "share")
        recorder.figure("replayed workload: answers of another question served", wrong, "answers")
        recorder.table(
            "The replayed workload at the threshold for precision 0.8: requests answered by each layer.",
            ["layer", "requests"],
            [[tier, str(count)] for tier, count in sorted(tiers.items())],
        )
    recorder.note(
        "L1 and L2 are whole lookups as a request makes them (keys hashed, layers tried in turn); L3's"
        " search is given the vector and the embedding is shown apart, so an L3 hit costs both."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--lookups", type=int, default=2_000)
    parser.add_argument("--runs", type=int, default=3)
    add_summary_option(parser)
    args = parser.parse_args()
    recorder = SummaryRecorder(
        bench="result_layers",
        title="The result cache's layers at 100,000 entries, the embedding apart, the calibrated threshold",
        module="bench.result_layers_bench",
        argv=sys.argv[1:],
        parameters=parameters_of(args),
        runs=args.runs,
    )
    asyncio.run(main_async(args, recorder))
    recorder.write(args.summary_json)


if __name__ == "__main__":
    main()
