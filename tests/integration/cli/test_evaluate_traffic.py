"""`warmplane evaluate-traffic` as a process against the real broker: a known stream of request events
gives known figures, and a Mooncake slice replayed as events comes back as the same trace, with the same
evaluator figures as the evaluator run on the slice directly."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from aiokafka import AIOKafkaProducer

from tests.integration.planner_harness import produce, run_warmplane
from warmplane.services.devstack.job import DEFAULT_TRACE
from warmplane.services.planner.trace_eval.evaluation import evaluate
from warmplane.services.planner.trace_eval.fleet_sim import requests_from_trace
from warmplane.services.planner.trace_eval.params import EvalParams
from warmplane.services.planner.trace_eval.report import policy_table, setting
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, RequestObserved
from warmplane.shared.mooncake_trace import read_trace
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
SLICE = 600


def _kafka(embedded: EmbeddedKafka) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=embedded.bootstrap_servers, topic_prefix=f"e{uuid.uuid4().hex[:8]}"
    )


async def _warmplane(kafka: KafkaSettings, *args: str) -> tuple[int, str]:
    env = {
        "WARMPLANE_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "WARMPLANE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
    }
    return await run_warmplane(env, *args)


def _observed(
    chain: list[int],
    tokens: list[int],
    *,
    at_s: float,
    cached: int = 0,
    ttft_ms: float | None = None,
    tenant: str = "acme",
    model: str = "m-1",
) -> RequestObserved:
    return RequestObserved(
        event_id=new_event_id(),
        occurred_at=T0 + timedelta(seconds=at_s),
        producer="test",
        tenant=tenant,
        model=ModelRef(model, "r1"),
        replica="replica-0",
        chain=chain,
        chain_tokens=tokens,
        prompt_tokens=tokens[-1] + 5,
        cached_tokens=cached,
        ttft_ms=ttft_ms,
    )


KNOWN = [
    _observed([1, 2], [40, 80], at_s=0, ttft_ms=500.0),
    _observed([1, 2, 3], [40, 80, 120], at_s=10, cached=64, ttft_ms=100.0),
    _observed([1, 2], [40, 80], at_s=20, cached=64, ttft_ms=120.0),  # an exact repeat of the first
    _observed([7], [50], at_s=400, ttft_ms=700.0),
    _observed([1, 4], [40, 90], at_s=500, cached=32, ttft_ms=150.0),
    _observed([8], [10], at_s=600),  # shorter than a block, no TTFT
]
AROUND = [
    _observed([1, 2], [40, 80], at_s=-1, ttft_ms=1.0),  # before --since
    _observed([1, 2], [40, 80], at_s=3600, ttft_ms=1.0),  # at --until: excluded
    _observed([1, 2], [40, 80], at_s=5, ttft_ms=1.0, tenant="globex"),
    _observed([1, 2], [40, 80], at_s=5, ttft_ms=1.0, model="m-2"),
]


async def _produce_undecodable(kafka: KafkaSettings, key: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        await asyncio.wait_for(
            await producer.send(Topics(kafka.topic_prefix).requests, b"{not json", key=key), 30
        )
    finally:
        await producer.stop()


async def test_a_known_stream_gives_known_figures_and_trace(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    kafka = _kafka(embedded_kafka)
    await produce(kafka, [*KNOWN, *AROUND])
    await _produce_undecodable(kafka, b"acme/m-1/1")
    report, exported = tmp_path / "report.md", tmp_path / "trace.jsonl"
    until = (T0 + timedelta(hours=1)).isoformat()
    code, output = await _warmplane(
        kafka, "evaluate-traffic", "--tenant", "acme", "--model", "m-1", "--since", T0.isoformat(),
        "--until", until, "--output", str(report), "--trace-output", str(exported),
    )  # fmt: skip
    assert code == 0, output
    text = report.read_text()
    assert text in output
    assert "Read 11 records" in text and "2 of other tenants or models skipped by key, 1 undecodable" in text
    assert "Selected 6 requests" in text and "spanning 600 s" in text
    assert "5 requests, 25 blocks, 1 request without a full block left out" in text
    # Cold: 500 and 700 ms (prompts 85 and 55); cached: 100, 120, 150 ms (prompts 125, 85, 95).
    assert "| no cached tokens (cold) | 2 | 500 | 700 | 55 |" in text
    assert "| some cached tokens | 3 | 120 | 150 | 95 |" in text
    assert "Cold over cached: median 4.17x, p90 4.67x; 1 request without a TTFT left out." in text
    assert "| result cache | 1 exact repeat (16.7% of requests" in text
    # Seen within a minute: the 2nd and 3rd requests (80 tokens each of 430); within the hour, the 5th too
    # (its 40-token root, 480 s after the 3rd).
    assert "| 1 min | 33.3% | 37.2% |" in text and "| 5 min | 33.3% | 37.2% |" in text
    assert "| 60 min | 50.0% | 46.5% |" in text
    assert "| policy | hit 1 min |" in text and "| warmplane |" in text

    records = list(read_trace(exported))
    assert [r.timestamp for r in records] == [0, 10_000, 20_000, 400_000, 500_000]
    assert [len(r.hash_ids) for r in records] == [5, 7, 5, 3, 5]
    first, extended, repeat, _, sibling = (r.hash_ids for r in records)
    assert repeat == first and extended[:5] == first and extended[5] not in first
    # Segment 1 (40 tokens) holds the ends of two blocks: the sibling shares those and nothing after.
    assert sibling[:2] == first[:2] and not set(sibling[2:]) & set(first)
    assert [r.input_length for r in records] == [80, 120, 80, 50, 90]


async def test_nothing_recorded_for_the_tenant_exits_1_and_says_so(embedded_kafka: EmbeddedKafka) -> None:
    kafka = _kafka(embedded_kafka)
    await produce(kafka, AROUND[2:])
    code, output = await _warmplane(kafka, "evaluate-traffic", "--tenant", "acme", "--model", "m-1")
    assert code == 1, output
    assert "Selected 0 requests" in output and "No request has a block to simulate." in output


async def test_a_missing_request_topic_is_an_error_that_names_it(embedded_kafka: EmbeddedKafka) -> None:
    kafka = _kafka(embedded_kafka)
    code, output = await _warmplane(kafka, "evaluate-traffic", "--tenant", "acme", "--model", "m-1")
    assert code == 2 and f"no topic {Topics(kafka.topic_prefix).requests}" in output


async def test_a_replayed_trace_slice_evaluates_as_the_slice_itself(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    kafka = _kafka(embedded_kafka)
    code, output = await _warmplane(
        kafka, "replay", str(DEFAULT_TRACE), "--tenant", "acme", "--model", "m-1", "--limit", str(SLICE)
    )
    assert code == 0, output
    report, exported = tmp_path / "report.md", tmp_path / "trace.jsonl"
    code, output = await _warmplane(
        kafka, "evaluate-traffic", "--tenant", "acme", "--model", "m-1", "--block-tokens", "512",
        "--partial-blocks", "keep", "--output", str(report), "--trace-output", str(exported),
    )  # fmt: skip
    assert code == 0, output

    original = list(read_trace(DEFAULT_TRACE, SLICE))
    records = list(read_trace(exported))
    assert len(records) == SLICE
    assert [r.hash_ids for r in records] == [r.hash_ids for r in original]
    assert [(r.timestamp, r.input_length) for r in records] == [
        (r.timestamp - original[0].timestamp, r.input_length) for r in original
    ]
    # The evaluator on the slice itself, with what the command uses at 512-token blocks.
    direct = evaluate("slice", requests_from_trace(original, 512), EvalParams(block_tokens=512))
    text = report.read_text()
    assert setting(direct) in text
    for line in policy_table(direct):
        assert line in text
    assert direct.by_policy("none").hit_all > 0  # the slice has reuse: the comparison is not of zeros
