"""`python -m warmplane.services.warmer`, a real process, told to stop as Kubernetes tells a pod's
containers: the first SIGTERM drains its replicas (draining, then stopped) and exits 0; a second signal
during the drain stops it at once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from tests.integration.gateway_harness import kafka_settings
from tests.integration.planner_harness import poll_until, read_topic
from warmplane.shared.codec import EventCodec
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.events import ReplicaEvent
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics


def start_warmer(kafka: KafkaSettings, node: str, settle_s: float, log: Path) -> subprocess.Popen[bytes]:
    """A warmer whose one engine never answers (nothing listens at its URL)."""
    engine = {"replica": f"{node}-r0", "url": "http://127.0.0.1:9", "served_model": "m"}
    env = {
        **os.environ,
        "WARMPLANE_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "WARMPLANE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
        "WARMPLANE_KAFKA__PARTITIONS": str(kafka.partitions),
        "WARMPLANE_NODE": node,
        "WARMPLANE_ENGINES": json.dumps([engine]),
        "WARMPLANE_HTTP_HOST": "127.0.0.1",
        "WARMPLANE_HTTP_PORT": "0",
        "WARMPLANE_DRAIN__SETTLE_S": str(settle_s),
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "warmplane.services.warmer"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def logged(log: Path, text: str) -> None:
    async def said() -> bool:
        return text in await asyncio.to_thread(log.read_text)

    await poll_until(said, timeout_s=60, what=f"{text!r} in the warmer's log")


async def lifecycle_of(kafka: KafkaSettings, replica: str) -> list[ReplicaEvent]:
    codec = EventCodec(kafka.max_event_bytes)
    events = [codec.decode(r.value) for r in await read_topic(kafka, Topics(kafka.topic_prefix).lifecycle)]
    return [e for e in events if isinstance(e, ReplicaEvent) and e.replica == replica]


async def test_sigterm_drains_the_replicas_then_the_warmer_exits(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    kafka = kafka_settings(embedded_kafka.bootstrap_servers)
    log = tmp_path / "warmer.log"
    warmer = start_warmer(kafka, "node-a", settle_s=0.5, log=log)
    try:
        await logged(log, "warmer of node node-a")
        warmer.send_signal(signal.SIGTERM)
        assert warmer.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if warmer.poll() is None:
            os.killpg(warmer.pid, signal.SIGKILL)
    events = await lifecycle_of(kafka, "node-a-r0")
    assert [(e.STATE, e.reason) for e in events] == [
        ("starting", "warmer started"),
        ("draining", "the warmer received SIGTERM"),
        ("gone", "drained: the engine no longer answers"),
    ]


async def test_a_second_signal_stops_a_draining_warmer_at_once(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    kafka = kafka_settings(embedded_kafka.bootstrap_servers)
    log = tmp_path / "warmer.log"
    node = f"node-{uuid.uuid4().hex[:6]}"
    warmer = start_warmer(kafka, node, settle_s=600, log=log)
    try:
        await logged(log, "warmer of node")
        warmer.send_signal(signal.SIGTERM)
        await logged(log, "SIGTERM: draining")
        warmer.send_signal(signal.SIGINT)
        assert warmer.wait(30) == 0, log.read_text()[-3000:]  # not the 600 s the drain would settle
    finally:
        if warmer.poll() is None:
            os.killpg(warmer.pid, signal.SIGKILL)
    assert [e.STATE for e in await lifecycle_of(kafka, f"{node}-r0")] == ["starting", "draining"]
