"""Publishing events that must not be lost (plans, lifecycle, warm results): acknowledged, or an error.

Unlike the emitter SDK, which never makes serving wait and drops what does not fit, this publisher is for
control-plane events: `publish` returns once the broker acknowledged the event (with the producer's
`acks`), and raises if it did not within the timeout. Each event goes to its family's topic under its
partition key (`topics`), so related events stay in order, signed when the services share event keys
(`event_signing.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer

from warmplane.shared.codec import EventCodec
from warmplane.shared.event_signing import EventSigner
from warmplane.shared.events import Event
from warmplane.shared.kafka_clients import client_security
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics, partition_key


def acknowledging_producer(kafka: KafkaSettings, name: str) -> AIOKafkaProducer:
    """A producer (not started) for control-plane events: every write acknowledged by all in-sync
    replicas (`acks='all'`), requests bounded by `request_timeout_ms`; its client id ends in `name`."""
    return AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap_servers,
        **client_security(kafka.security),
        client_id=f"{kafka.client_id}-{name}",
        acks="all",
        request_timeout_ms=kafka.request_timeout_ms,
    )


class KafkaEventPublisher:
    """Publishes through a started producer the caller owns (use `acks='all'`)."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        topics: Topics,
        codec: EventCodec,
        timeout_s: float,
        signer: EventSigner | None = None,
    ) -> None:
        self._signer = signer if signer is not None else EventSigner([])
        self._producer = producer
        self._topics = topics
        self._codec = codec
        self._timeout_s = timeout_s

    async def publish(self, event: Event) -> None:
        """Return once the broker acknowledged `event`; raise (a Kafka or timeout error) if it did not."""
        await self.publish_all([event])

    async def publish_all(self, events: Sequence[Event]) -> None:
        """Hand every event to the producer in order, then return once the broker acknowledged all of
        them (one round trip for many); raise if any was not within the timeout. Events of one partition
        keep their order; after a failure some may be on the broker already, so a retry may repeat them
        (consumers de-duplicate by event id)."""
        pending = []
        for event in events:
            value = self._codec.encode(event)
            pending.append(
                await self._producer.send(
                    self._topics.for_event(event),
                    value=value,
                    key=partition_key(event),
                    headers=self._signer.headers(value),
                )
            )
        async with asyncio.timeout(self._timeout_s):
            await asyncio.gather(*pending)
