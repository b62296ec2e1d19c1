"""`warmplane replay` as a process against the real broker: every request of the trace arrives as a
request event of the given tenant and model, in the trace's order and spacing."""

from __future__ import annotations

import uuid

from tests.integration.planner_harness import read_topic, run_warmplane
from warmplane.services.devstack.job import DEFAULT_TRACE
from warmplane.shared.codec import EventCodec
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.events import RequestObserved
from warmplane.shared.mooncake_trace import read_trace
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics

REQUESTS = 500


async def _warmplane(kafka: KafkaSettings, *args: str) -> tuple[int, str]:
    env = {
        "WARMPLANE_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "WARMPLANE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
    }
    return await run_warmplane(env, *args)


async def test_a_trace_is_replayed_as_request_events_with_progress(embedded_kafka: EmbeddedKafka) -> None:
    kafka = KafkaSettings(
        bootstrap_servers=embedded_kafka.bootstrap_servers, topic_prefix=f"r{uuid.uuid4().hex[:8]}"
    )
    code, output = await _warmplane(
        kafka, "replay", str(DEFAULT_TRACE), "--tenant", "acme", "--model", "m-1", "--limit", str(REQUESTS)
    )
    assert code == 0, output
    assert output.rstrip().endswith(
        f"{REQUESTS} request events sent to {Topics(kafka.topic_prefix).requests}, 0 dropped"
    )
    assert f"emitted / acknowledged: {REQUESTS} / {REQUESTS} of {REQUESTS}" in output

    codec = EventCodec(kafka.max_event_bytes)
    events = [codec.decode(r.value) for r in await read_topic(kafka, Topics(kafka.topic_prefix).requests)]
    assert all(isinstance(e, RequestObserved) for e in events) and len(events) == REQUESTS
    observed = sorted((e for e in events if isinstance(e, RequestObserved)), key=lambda e: e.occurred_at)
    trace = list(read_trace(DEFAULT_TRACE, REQUESTS))
    assert {(e.tenant, e.model.name) for e in observed} == {("acme", "m-1")}
    assert sorted(tuple(e.chain) for e in observed) == sorted(tuple(r.hash_ids) for r in trace)
    span = (observed[-1].occurred_at - observed[0].occurred_at).total_seconds() * 1000
    assert span == trace[-1].timestamp - trace[0].timestamp


async def test_a_missing_trace_is_an_error_that_names_it(embedded_kafka: EmbeddedKafka) -> None:
    kafka = KafkaSettings(bootstrap_servers=embedded_kafka.bootstrap_servers)
    code, output = await _warmplane(kafka, "replay", "/nonexistent.jsonl", "--tenant", "a", "--model", "m")
    assert code == 2 and "no trace at /nonexistent.jsonl" in output
