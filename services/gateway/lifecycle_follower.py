"""Membership from the lifecycle topic: every replica and epoch event, replayed from the earliest offset.

The follower consumes `<prefix>.lifecycle` in a consumer group of its own (`<group_id_prefix>-<instance>`:
the instance name must be unique per gateway process) from the earliest offset and never commits, so
each start replays the topic and learns the current state; replica events feed a `ReplicaTable`,
`epoch.bumped` an `EpochBook`. `caught_up` is set once every assigned partition has been read to the end
offset it had when assigned. An event that does not decode is counted, logged (rarely) and skipped; so
is one not signed by a shared event key when keys are set (`shared/event_signing.py`): a forged
`replica.became_ready` would point the gateway at the forger's endpoint. The gateway does not
dead-letter them: every instance reads the whole topic, and the planner's group dead-letters each once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from aiokafka import AIOKafkaConsumer, TopicPartition

from warmplane.services.gateway.membership import ReplicaTable
from warmplane.services.gateway.tenants import EpochBook
from warmplane.shared.codec import DecodeFailure, EventCodec
from warmplane.shared.event_signing import EventSigner
from warmplane.shared.events import EpochBumped
from warmplane.shared.group_consumer import group_consumer, stop_reader
from warmplane.shared.settings import KafkaSettings

log = logging.getLogger(__name__)


class LifecycleFollower:
    def __init__(
        self,
        kafka: KafkaSettings,
        topic: str,
        group_id: str,
        table: ReplicaTable,
        epochs: EpochBook,
        *,
        signer: EventSigner | None = None,
    ) -> None:
        self._signer = signer if signer is not None else EventSigner([])
        self._kafka = kafka
        self._topic = topic
        self._group_id = group_id
        self._table = table
        self._epochs = epochs
        self._codec = EventCodec(kafka.max_event_bytes)
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._ends: dict[TopicPartition, int] | None = None
        self.caught_up = asyncio.Event()
        self.undecodable = 0
        self.refused: Counter[str] = Counter()
        """Records dropped for their signature, by reason."""

    async def start(self) -> None:
        """Connect and start reading in the background. Raises what aiokafka raises if the broker is down."""
        kafka = self._kafka
        consumer = group_consumer(kafka, self._topic, name=self._group_id, group_id=self._group_id)
        await consumer.start()
        self._consumer = consumer
        self._task = asyncio.create_task(self._run(consumer), name="gateway lifecycle follower")
        self._task.add_done_callback(_report_death)

    async def stop(self) -> None:
        await stop_reader(self._task, self._consumer)

    async def _run(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=500, max_records=1000)
            for records in batches.values():
                for record in records:
                    refusal = self._signer.refusal(record.value, record.headers)
                    if refusal is None:
                        self._apply(record.value)
                    else:
                        self._refuse(refusal)
            if not self.caught_up.is_set():
                await self._check_caught_up(consumer)

    def _refuse(self, reason: str) -> None:
        self.refused[reason] += 1
        count = self.refused.total()
        if count & (count - 1) == 0:
            log.warning("dropped a lifecycle event (%d so far): %s", count, reason)

    def _apply(self, value: bytes | None) -> None:
        event = self._codec.decode(value)
        if isinstance(event, DecodeFailure):
            self.undecodable += 1
            if self.undecodable & (self.undecodable - 1) == 0:
                log.warning("skipped an undecodable lifecycle event (%d so far): %s", self.undecodable, event)
            return
        if isinstance(event, EpochBumped):
            if event.tenant:
                self._epochs.bump(event.tenant, event.model.name, event.epoch)
            return
        self._table.apply(event)

    async def _check_caught_up(self, consumer: AIOKafkaConsumer) -> None:
        assigned = consumer.assignment()
        if not assigned:
            return
        if self._ends is None:
            self._ends = await consumer.end_offsets(list(assigned))
        for partition, end in self._ends.items():
            if partition in assigned and await consumer.position(partition) < end:
                return
        self.caught_up.set()


def _report_death(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.critical("the lifecycle follower stopped: membership is frozen: %r", error, exc_info=error)
