"""Control events signed under the services' shared keys, on the real broker and Postgres: the planner
dead-letters unsigned and badly signed lifecycle events with the reason and counts them, a warmer so its
plans; a gateway drops a forged `replica.became_ready` and keeps following; during a rotation, events under
either key count."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import asyncpg
from aiokafka import AIOKafkaProducer
from prometheus_client import Counter
from pydantic import SecretStr

from tests.integration.gateway_harness import kafka_settings
from tests.integration.planner.test_dead_letters import DeadLetterReader, dead_lettered_by_reason
from tests.integration.planner_harness import MODEL, poll_until
from tests.integration.warmer_harness import warmer_settings
from warmplane.services.gateway.lifecycle_follower import LifecycleFollower
from warmplane.services.gateway.membership import ReplicaTable
from warmplane.services.gateway.tenants import EpochBook
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.settings import PlannerSettings
from warmplane.services.warmer.service import Warmer
from warmplane.shared.codec import EventCodec
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.event_publisher import KafkaEventPublisher, acknowledging_producer
from warmplane.shared.event_signing import EventSigner
from warmplane.shared.events import (
    EpochBumped,
    Event,
    ModelRef,
    ReplicaBecameReady,
    ReplicaStarted,
    WarmPlanIssued,
)
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import DeadLetterHeaders, Topics, partition_key

NEW_KEY = SecretStr("the-new-event-key-of-this-test-0123456789")
OLD_KEY = SecretStr("the-old-event-key-of-this-test-0123456789")
STRANGER_KEY = SecretStr("a-key-no-warmplane-service-holds-012345")
_TIMEOUT_S = 20.0


async def _publish(kafka: KafkaSettings, events: Sequence[Event], keys: Sequence[SecretStr]) -> None:
    """`events` as a Warmplane service publishes them, signed under `keys[0]` (unsigned without keys)."""
    producer = acknowledging_producer(kafka, "test")
    await producer.start()
    try:
        topics = Topics(kafka.topic_prefix)
        publisher = KafkaEventPublisher(producer, topics, EventCodec(), _TIMEOUT_S, EventSigner(keys))
        await publisher.publish_all(events)
    finally:
        await producer.stop()


async def _forge(kafka: KafkaSettings, event: Event, signature: bytes) -> None:
    """`event` with a made-up signature header, as someone without the keys could produce it."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
    await producer.start()
    try:
        topic = Topics(kafka.topic_prefix).for_event(event)
        value = EventCodec().encode(event)
        await producer.send_and_wait(
            topic, value, key=partition_key(event), headers=[("warmplane-signature", signature)]
        )
    finally:
        await producer.stop()


def _bump(tenant: str, epoch: int) -> EpochBumped:
    return EpochBumped(
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="api:test",
        tenant=tenant,
        model=MODEL,
        epoch=epoch,
    )


async def test_the_planner_dead_letters_unsigned_and_badly_signed_lifecycle_events_with_the_reason(
    planner_settings: PlannerSettings,
) -> None:
    settings = planner_settings.model_copy(update={"event_keys": [NEW_KEY, OLD_KEY]})
    kafka = settings.kafka
    await ensure_topics(kafka, Topics(kafka.topic_prefix).all())
    await _publish(kafka, [_bump("acme", 3)], [NEW_KEY])
    await _publish(kafka, [_bump("initech", 4)], [OLD_KEY])  # the key being rotated out still counts
    await _publish(kafka, [_bump("globex", 9)], [])  # unsigned
    await _publish(kafka, [_bump("umbrella", 5)], [STRANGER_KEY])
    await _forge(kafka, _bump("hooli", 7), b"hmac-sha256=not base64!")
    db = await asyncpg.connect(settings.postgres.asyncpg_dsn(), timeout=_TIMEOUT_S)
    try:
        async with running_planner(settings) as planner, DeadLetterReader(kafka) as letters:

            async def settled() -> bool:
                recorded = await db.fetchval("SELECT count(*) FROM epochs")
                return bool(await letters.read_available() >= 3 and recorded == 2)

            await poll_until(
                settled, timeout_s=_TIMEOUT_S, what="signed bumps recorded, the rest dead-lettered"
            )
            by_reason = dead_lettered_by_reason(planner.metrics)
        epochs = dict(await db.fetch("SELECT tenant, epoch FROM epochs"))
    finally:
        await db.close()
    assert epochs == {"acme": 3, "initech": 4}
    reasons = sorted(dict(r.headers)[DeadLetterHeaders.REASON].decode() for r in letters.records)
    assert reasons == [
        "badly signed control event: no current key signed it",
        "badly signed control event: the signature is not base64",
        "unsigned control event: no warmplane-signature header",
    ]
    assert (by_reason["unsigned"], by_reason["bad_signature"]) == (1, 2)
    for record in letters.records:  # the original bytes, for whoever looks into it
        assert EventCodec().decode(record.value).tenant in {"globex", "umbrella", "hooli"}  # type: ignore[union-attr]


def _lifecycle(cls: type[ReplicaStarted | ReplicaBecameReady], replica: str, endpoint: str) -> Event:
    return cls(
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="warmer/node-0",
        model=ModelRef("tiny", "rev"),
        replica=replica,
        node="node-0",
        endpoint=endpoint,
    )


@contextlib.asynccontextmanager
async def _following(
    kafka: KafkaSettings, keys: Sequence[SecretStr]
) -> AsyncIterator[tuple[LifecycleFollower, ReplicaTable, EpochBook]]:
    """A gateway's lifecycle follower, with the membership and epochs it feeds, read to the topic's end."""
    table, epochs = ReplicaTable(), EpochBook()
    group = f"gateway-test-{uuid.uuid4().hex[:8]}"
    follower = LifecycleFollower(
        kafka, Topics(kafka.topic_prefix).lifecycle, group, table, epochs, signer=EventSigner(keys)
    )
    await follower.start()
    try:
        await asyncio.wait_for(follower.caught_up.wait(), _TIMEOUT_S)
        yield follower, table, epochs
    finally:
        await follower.stop()


async def test_a_gateway_ignores_a_forged_replica_and_epoch_and_follows_signed_ones(
    embedded_kafka: EmbeddedKafka,
) -> None:
    kafka = kafka_settings(embedded_kafka.bootstrap_servers)
    await ensure_topics(kafka, [Topics(kafka.topic_prefix).lifecycle])
    good = [_lifecycle(cls, "r-good", "http://10.0.0.1:8000") for cls in (ReplicaStarted, ReplicaBecameReady)]
    await _publish(kafka, good, [OLD_KEY])
    await _publish(kafka, [_lifecycle(ReplicaBecameReady, "r-evil", "http://attacker.example:80")], [])
    evil = _lifecycle(ReplicaBecameReady, "r-evil-2", "http://attacker.example:81")
    await _publish(kafka, [evil], [STRANGER_KEY])
    await _publish(kafka, [_bump("acme", 99)], [])
    async with _following(kafka, [NEW_KEY, OLD_KEY]) as (follower, table, epochs):
        later = datetime.now(UTC).timestamp() + 3_600  # past any ramp
        assert [replica.name for replica in table.ready("tiny", later)] == ["r-good"]
        assert epochs.epoch("acme", MODEL.name) == 0
        assert follower.refused == {
            "unsigned control event: no warmplane-signature header": 2,
            "badly signed control event: no current key signed it": 1,
        }


def _counted(counter: Counter, label: str) -> dict[str, float]:
    [metric] = counter.collect()
    return {s.labels[label]: s.value for s in metric.samples if s.name.endswith("_total")}


def _plan(node: str) -> WarmPlanIssued:
    plan_id = new_event_id()
    return WarmPlanIssued(
        event_id=plan_id,
        occurred_at=datetime.now(UTC),
        producer="planner/test",
        model=MODEL,
        plan_id=plan_id,
        replica="no-such-replica",
        node=node,
        epoch=0,
        items=[],
        budget_tokens=10_000,
        deadline=datetime.now(UTC) + timedelta(minutes=5),
    )


async def test_a_warmer_dead_letters_an_unsigned_plan_and_answers_a_signed_one(
    embedded_kafka: EmbeddedKafka,
) -> None:
    kafka = kafka_settings(embedded_kafka.bootstrap_servers)
    node = f"node-{uuid.uuid4().hex[:6]}"
    settings = warmer_settings(kafka, [], node=node, secrets={}).model_copy(update={"event_keys": [NEW_KEY]})
    signed, unsigned = _plan(node), _plan(node)
    async with Warmer(settings) as warmer, DeadLetterReader(kafka) as letters:
        await _publish(kafka, [unsigned], [])
        await _publish(kafka, [signed], [NEW_KEY])

        async def answered() -> bool:
            # The signed plan names a replica this node does not drive: refused with a reason, which
            # shows it was read and judged; the unsigned one never gets that far.
            plans = _counted(warmer.metrics.plans, "outcome")
            return await letters.read_available() >= 1 and plans.get("unknown_replica") == 1

        await poll_until(
            answered, timeout_s=_TIMEOUT_S, what="the signed plan judged, the other dead-lettered"
        )
        [letter] = letters.records
        assert dict(letter.headers)[DeadLetterHeaders.REASON] == (
            b"unsigned control event: no warmplane-signature header"
        )
        assert EventCodec().decode(letter.value).event_id == unsigned.event_id  # type: ignore[union-attr]
        assert _counted(warmer.metrics.dead_lettered, "reason") == {"unsigned": 1}
