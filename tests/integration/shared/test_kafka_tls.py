"""Kafka over TLS with one setting style for every client: the emitter, the planner's faststream consumer,
the control-plane producer and group consumer the warmers, gateways and API use, and the CLI's topic read.

The embedded broker (Tansu) has no TLS listener and no SASL, so TLS ends in a terminator in front of it
(`tls_terminator.py`) whose address the broker advertises: every client reaches the broker only through
TLS, verified against a CA this test makes. SASL stops at the clients' options (`test_kafka_security.py`):
there is no broker here to log in to.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError
from aiokafka.structs import ConsumerRecord

from tests.integration.gateway_harness import epoch_bumped
from tests.integration.planner_harness import poll_until, request
from tests.integration.tls_terminator import TlsTerminator, make_certificates, server_context
from tests.integration.warmer_harness import counted
from tests.real_parts import planner_settings_for
from warmplane.services.cli.request_topic import read_requests
from warmplane.services.planner.app import running_planner
from warmplane.shared.codec import EventCodec
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.embedded.processes import free_port
from warmplane.shared.emitter import Emitter
from warmplane.shared.event_publisher import KafkaEventPublisher, acknowledging_producer
from warmplane.shared.group_consumer import group_consumer
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import EmitterSettings, KafkaSecurity, KafkaSettings
from warmplane.shared.topics import Topics


@pytest.fixture
async def tls_broker(tmp_path: Path) -> AsyncIterator[tuple[TlsTerminator, Path]]:
    make_certificates(tmp_path)
    front = free_port()
    with EmbeddedKafka(tmp_path / "kafka", advertised=f"127.0.0.1:{front}") as broker:
        context = server_context(str(tmp_path / "server.pem"), str(tmp_path / "server.key"))
        async with TlsTerminator(("127.0.0.1", broker.port), context, port=front) as terminator:
            yield terminator, tmp_path


def over_tls(terminator: TlsTerminator, ca: Path, base: KafkaSettings) -> KafkaSettings:
    security = KafkaSecurity(protocol="SSL", ca_file=str(ca))
    return base.model_copy(update={"bootstrap_servers": f"127.0.0.1:{terminator.port}", "security": security})


async def test_a_plaintext_client_or_an_unknown_ca_does_not_get_through(
    tls_broker: tuple[TlsTerminator, Path],
) -> None:
    terminator, folder = tls_broker
    plain = KafkaSettings(bootstrap_servers=f"127.0.0.1:{terminator.port}", request_timeout_ms=2_000)
    with pytest.raises((KafkaConnectionError, TimeoutError)):
        await ensure_topics(plain, ["t.plain"], timeout_s=5)
    with pytest.raises((KafkaConnectionError, TimeoutError)):
        await ensure_topics(over_tls(terminator, folder / "other-ca.pem", plain), ["t.other"], timeout_s=5)
    assert terminator.sessions == 0
    await ensure_topics(over_tls(terminator, folder / "ca.pem", plain), ["t.tls"], timeout_s=20)
    assert terminator.sessions > 0


async def test_every_client_of_the_loop_works_over_tls(
    tls_broker: tuple[TlsTerminator, Path], migrated_database: str
) -> None:
    terminator, folder = tls_broker
    base = planner_settings_for("127.0.0.1:9", migrated_database)
    kafka = over_tls(terminator, folder / "ca.pem", base.kafka)
    settings = base.model_copy(update={"kafka": kafka})
    topics = Topics(kafka.topic_prefix)
    await ensure_topics(kafka, topics.all())

    async with running_planner(settings):  # faststream's consumer, over TLS
        async with Emitter(kafka, EmitterSettings(linger_ms=1, close_timeout_s=10), topics) as emitter:
            assert emitter.emit(request([21, 22])) and emitter.emit(request([21]))
        await poll_until(
            lambda: counted(migrated_database, 2),
            timeout_s=60,
            what="the planner to count what the emitter sent",
        )

    producer = acknowledging_producer(kafka, "tls-test")  # the warmers', gateways' and API's
    await producer.start()
    try:
        bump = epoch_bumped("acme", "m", 3)
        await KafkaEventPublisher(producer, topics, EventCodec(kafka.max_event_bytes), 10).publish(bump)
    finally:
        await producer.stop()
    consumer = group_consumer(kafka, topics.lifecycle, name="tls-test", group_id="tls-test")
    await consumer.start()
    try:
        async with asyncio.timeout(30):
            records: list[ConsumerRecord[bytes, bytes]] = []
            while not records:
                batches = await consumer.getmany(timeout_ms=500)
                records = [r for batch in batches.values() for r in batch]
    finally:
        await consumer.stop()
    assert EventCodec(kafka.max_event_bytes).decode(records[0].value) == bump

    log = await read_requests(kafka, topics.requests, deadline_s=30)  # evaluate-traffic's read
    assert sorted(len(r.chain) for r in log.requests) == [1, 2]
