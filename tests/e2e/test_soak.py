"""A minute of the soak (`bench/soak_run.py`) on real parts: after its warm-up no service's memory grows past
10%, nor its descriptors or event-loop tasks past a few, nothing is lost, and every plan ends. The ten-minute
soak is the benchmark (`python -m bench.soak`)."""

from __future__ import annotations

from pathlib import Path

from bench.soak_fleet import Parts
from bench.soak_run import SoakShape, run_soak
from tests.real_parts import fresh_database
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres, EmbeddedRedis
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm
from warmplane.shared.plan_states import FINAL_PLAN_STATES

SHAPE = SoakShape(duration_s=60, warmup_s=20, event_rate=500, chat_rate=2, bump_every_s=12, read_every_s=2)
SERVICES = ("planner", "warmer", "gateway", "api")
MEMORY_GROWTH = 1.10
SLACK = 3
"""Descriptors and tasks a service at rest may hold past its count at the end of the warm-up without a leak:
a pool's connection opened late, say. A leak of one a request, a warm or a read would show by the dozen."""


async def test_a_minute_of_load_leaks_nothing_and_loses_nothing(
    embedded_kafka: EmbeddedKafka,
    embedded_postgres: EmbeddedPostgres,
    embedded_redis: EmbeddedRedis,
    own_engine: EmbeddedVllm,
    tmp_path: Path,
) -> None:
    async with fresh_database(embedded_postgres) as dsn:
        parts = Parts(embedded_kafka.bootstrap_servers, dsn, embedded_redis.url, own_engine)
        result = await run_soak(parts, tmp_path, SHAPE)

    report = {name: (result.baseline(name), result.peak(name), result.rest[name]) for name in SERVICES}
    for name, (baseline, peak, rest) in report.items():
        assert peak.rss_bytes <= MEMORY_GROWTH * baseline.rss_bytes, (name, report)
        assert rest.open_fds <= baseline.open_fds + SLACK, (name, report)
        assert rest.loop_tasks <= baseline.loop_tasks + SLACK, (name, report)

    tally = result.tally
    assert tally.emitted >= SHAPE.event_rate * SHAPE.duration_s * 0.9
    assert result.dropped == 0 and result.sent == tally.emitted == result.from_load
    assert set(tally.chats) == {200} and sum(tally.chats.values()) >= SHAPE.duration_s  # about 2 a second
    assert set(tally.reads) == {200} and set(tally.bumps) == {202}
    assert result.on_topic > result.from_load  # the gateway's own events are in the truth too
    assert result.counted == result.on_topic  # each event counted once: none lost, none twice
    assert (
        set(result.plans) <= FINAL_PLAN_STATES
        and result.plans.get("verified", 0) >= 1 + sum(tally.bumps.values()) // 2
    ), result.plans
    assert result.exit_codes == dict.fromkeys(SERVICES, 0)
