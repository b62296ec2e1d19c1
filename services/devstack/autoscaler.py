"""The development stack's autoscaler: `fleet.scaled` up starts engines, as a cluster's autoscaler would.

In production the autoscaler (KEDA, an HPA, a person) adds pods and publishes `fleet.scaled`; Warmplane
only reacts to it. In the development stack nothing else would start an engine, so this follows the
lifecycle topic and, for each `fleet.scaled` of the fleet's model to more replicas than it has, schedules
the missing ones (`Fleet.schedule`). The main job's own scale-up goes this way too, through the API as
`warmplane scale` sends it: what the job does once, a person can do again. A scale down is not acted on
(the engines keep serving; the planner re-plans the ready replicas all the same).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Self

from aiokafka import AIOKafkaConsumer

from warmplane.services.devstack.fleet import Fleet
from warmplane.services.warmer.replica_driver import ReplicaDriver
from warmplane.shared.codec import EventCodec
from warmplane.shared.events import FleetScaled
from warmplane.shared.group_consumer import group_consumer, stop_reader
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics

log = logging.getLogger(__name__)


class DevAutoscaler:
    """Follows the lifecycle topic from its start; `scheduled` yields each replica it scheduled."""

    def __init__(self, fleet: Fleet, kafka: KafkaSettings) -> None:
        self._fleet = fleet
        self._kafka = kafka
        self._codec = EventCodec(kafka.max_event_bytes)
        self.scheduled: asyncio.Queue[ReplicaDriver] = asyncio.Queue()
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        kafka = self._kafka
        consumer = group_consumer(
            kafka,
            Topics(kafka.topic_prefix).lifecycle,
            name="dev-autoscaler",
            group_id=f"warmplane-dev-autoscaler-{uuid.uuid4().hex[:8]}",
        )
        await consumer.start()
        self._consumer = consumer
        self._task = asyncio.create_task(self._run(consumer), name="dev autoscaler")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await stop_reader(self._task, self._consumer)

    async def next_scheduled(self, timeout_s: float = 60.0) -> ReplicaDriver:
        """The next replica scheduled; raises if the autoscaler stopped, or `TimeoutError`."""
        assert self._task is not None, "not started"
        waiting = asyncio.ensure_future(self.scheduled.get())
        done, _ = await asyncio.wait({waiting, self._task}, timeout=timeout_s, return_when="FIRST_COMPLETED")
        if waiting in done:
            return waiting.result()
        waiting.cancel()
        if self._task in done:
            self._task.result()
            raise RuntimeError("the dev autoscaler stopped")
        raise TimeoutError(f"no replica was scheduled within {timeout_s:.0f} s of a fleet.scaled")

    async def _run(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=500, max_records=100)
            for records in batches.values():
                for record in records:
                    event = self._codec.decode(record.value)
                    if isinstance(event, FleetScaled) and event.model.name == self._fleet.model:
                        self.scale(event)

    def scale(self, event: FleetScaled) -> None:
        """Schedule the replicas `event` asks for beyond those the fleet has (none for a scale down)."""
        missing = event.to_replicas - self._fleet.replicas
        if missing <= 0:
            log.info(
                "fleet.scaled to %d replicas of %s: it has %d, none started",
                event.to_replicas,
                event.model.name,
                self._fleet.replicas,
            )
            return
        for _ in range(missing):
            driver = self._fleet.schedule()
            log.info("fleet.scaled by %s: %s scheduled", event.producer, driver.replica)
            self.scheduled.put_nowait(driver)
