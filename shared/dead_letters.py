"""The dead-letter topic: the original bytes, untouched, with the reason and source in headers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from aiokafka import AIOKafkaProducer

from warmplane.shared.topics import DeadLetterHeaders


class RawRecord(Protocol):
    """The parts of a consumed record the pipeline reads (aiokafka's ConsumerRecord has them)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


@dataclass(frozen=True, slots=True)
class DeadLetter:
    record: RawRecord
    reason: str


class DeadLetterSink(Protocol):
    async def send_all(self, letters: Sequence[DeadLetter]) -> None:
        """Publish every letter and return once the broker has acknowledged all of them."""


class KafkaDeadLetterSink:
    """Publishes dead letters through a started producer that the caller owns (acks='all')."""

    def __init__(self, producer: AIOKafkaProducer, topic: str, consumer_name: str, timeout_s: float) -> None:
        self._producer = producer
        self._topic = topic
        self._consumer = consumer_name.encode()
        self._timeout_s = timeout_s

    async def send_all(self, letters: Sequence[DeadLetter]) -> None:
        """Publish every letter; return once the broker acknowledged all, or raise after the timeout."""
        pending = [
            await self._producer.send(
                self._topic,
                # The original key keeps the letter beside its peers; Kafka needs a key or a value,
                # and a tombstone has no value.
                key=letter.record.key if letter.record.key is not None else b"",
                value=letter.record.value,
                headers=[
                    (DeadLetterHeaders.REASON, letter.reason.encode()),
                    (DeadLetterHeaders.SOURCE_TOPIC, letter.record.topic.encode()),
                    (DeadLetterHeaders.SOURCE_PARTITION, str(letter.record.partition).encode()),
                    (DeadLetterHeaders.SOURCE_OFFSET, str(letter.record.offset).encode()),
                    (DeadLetterHeaders.CONSUMER, self._consumer),
                ],
            )
            for letter in letters
        ]
        async with asyncio.timeout(self._timeout_s):
            await asyncio.gather(*pending)


def reason_class(reason: str) -> str:
    """A bounded label for a free-text reason (metric label values must not explode)."""
    for prefix, label in (
        ("unsigned control event", "unsigned"),
        ("badly signed control event", "bad_signature"),
        ("schema_version", "future_schema"),
        ("unknown event type", "unknown_type"),
        ("message of", "oversized"),
        ("payload of", "oversized_payload"),
        ("not a JSON", "malformed"),
        ("empty message", "empty"),
        ("rejected by Postgres", "unstorable"),
    ):
        if reason.startswith(prefix):
            return label
    return "invalid"
