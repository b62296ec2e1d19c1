"""The gateway's membership and epochs seeded from the planner's registry in real Postgres: what the
lifecycle topic no longer holds (retention) is still known, and the topic's newer events still apply."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
from pydantic import SecretStr

from tests.integration.gateway_harness import gateway_settings, kafka_settings
from tests.integration.planner_harness import poll_until, produce
from warmplane.services.gateway.service import Gateway
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, ReplicaDrainingStarted
from warmplane.shared.settings import PostgresSettings

MODEL = "tiny"
INSERT_REPLICA = """
INSERT INTO replicas (replica_id, node, model, model_revision, endpoint, state, state_since, last_event_id)
VALUES ($1, 'node-1', $2, 'rev-1', $3, $4, $5, $6)
"""


async def test_a_restarted_gateway_knows_ready_replicas_and_epochs_older_than_the_topic(
    embedded_kafka: EmbeddedKafka, migrated_database: str
) -> None:
    long_ago = datetime.now(UTC) - timedelta(days=10)
    db = await asyncpg.connect(migrated_database)
    try:
        for name, state in (("r-old", "ready"), ("r-warming", "warming"), ("r-gone", "gone")):
            await db.execute(
                INSERT_REPLICA, name, MODEL, f"http://{name}:8000", state, long_ago, uuid.uuid4()
            )
        await db.execute(
            "INSERT INTO epochs (tenant, model, epoch, bumped_at, event_id) VALUES ('acme', $1, 4, $2, $3)",
            MODEL,
            long_ago,
            uuid.uuid4(),
        )
    finally:
        await db.close()

    kafka = kafka_settings(embedded_kafka.bootstrap_servers)  # a fresh topic: everything aged out
    settings, _ = gateway_settings(kafka, uuid.uuid4().hex[:8])
    options = settings.gateway.model_copy(update={"registry_seed": True})
    settings = settings.model_copy(
        update={"postgres": PostgresSettings(url=SecretStr(migrated_database)), "gateway": options}
    )
    async with Gateway(settings) as gateway:
        assert gateway.parts is not None
        membership = gateway.parts.router.membership
        now = datetime.now(UTC).timestamp()
        [ready] = membership.ready(MODEL, now)
        assert (ready.name, ready.url, ready.ready_at) == ("r-old", "http://r-old:8000", long_ago.timestamp())
        assert membership.serves(MODEL)
        assert gateway.parts.epochs.epoch("acme", MODEL) == 4
        assert gateway.parts.epochs.epoch("globex", MODEL) == 0

        draining = ReplicaDrainingStarted(
            event_id=new_event_id(),
            occurred_at=datetime.now(UTC),
            producer="warmer/node-1",
            model=ModelRef(MODEL, "rev-1"),
            replica="r-old",
            node="node-1",
        )
        await produce(kafka, [draining])

        async def left() -> bool:
            return membership.ready(MODEL, datetime.now(UTC).timestamp()) == []

        await poll_until(left, timeout_s=20, what="r-old to leave the ring once it drains")


async def test_without_a_reachable_registry_the_gateway_starts_on_the_topic_alone(
    embedded_kafka: EmbeddedKafka,
) -> None:
    kafka = kafka_settings(embedded_kafka.bootstrap_servers)
    settings, _ = gateway_settings(kafka, uuid.uuid4().hex[:8])
    options = settings.gateway.model_copy(update={"registry_seed": True, "registry_timeout_s": 2.0})
    unreachable = PostgresSettings(url=SecretStr("postgresql://nobody@127.0.0.1:9/warmplane"))
    settings = settings.model_copy(update={"postgres": unreachable, "gateway": options})
    async with Gateway(settings) as gateway:
        assert gateway.parts is not None
        assert gateway.parts.router.membership.models() == []
