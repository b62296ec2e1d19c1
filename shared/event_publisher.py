"""Publishing events that must not be lost (plans, lifecycle, warm results): acknowledged, or an error.

Unlike the emitter SDK, which never makes serving wait and drops what does not fit, this publisher is for
control-plane events: `publish` returns once the broker acknowledged the event (with the producer's
`acks`), and raises if it did not within the timeout. Each event goes to its family's topic under its
partition key (`topics`), so related events stay in order.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer

from warmplane.shared.codec import EventCodec
from warmplane.shared.events import Event
from warmplane.shared.topics import Topics, partition_key


class KafkaEventPublisher:
    """Publishes through a started producer the caller owns (use `acks='all'`)."""

    def __init__(
        self, producer: AIOKafkaProducer, topics: Topics, codec: EventCodec, timeout_s: float
    ) -> None:
        self._producer = producer
        self._topics = topics
        self._codec = codec
        self._timeout_s = timeout_s

    async def publish(self, event: Event) -> None:
        """Return once the broker acknowledged `event`; raise (a Kafka or timeout error) if it did not."""
        value = self._codec.encode(event)
        sent = await self._producer.send(self._topics.for_event(event), value=value, key=partition_key(event))
        await asyncio.wait_for(sent, self._timeout_s)
