"""Kafka topic names, partition keys and dead-letter headers: the one place they are spelled."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from warmplane.shared.events import Event, PrefixMissed, ReplicaEvent, RequestObserved, WarmPlanIssued


@dataclass(frozen=True, slots=True)
class Topics:
    """The topic names of one deployment; `prefix` lets several deployments share a cluster."""

    prefix: str = "warmplane"

    @property
    def requests(self) -> str:
        return f"{self.prefix}.requests"

    @property
    def misses(self) -> str:
        return f"{self.prefix}.misses"

    @property
    def lifecycle(self) -> str:
        """Replica lifecycle and fleet changes (deploys, scaling, epochs)."""
        return f"{self.prefix}.lifecycle"

    @property
    def plans(self) -> str:
        return f"{self.prefix}.plans"

    @property
    def warm_results(self) -> str:
        return f"{self.prefix}.warm-results"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}.dead-letter"

    def for_event(self, event: Event) -> str:
        """The topic an event is published to, by its family."""
        return _FAMILY_TOPIC[event.FAMILY](self)

    def all(self) -> tuple[str, ...]:
        return (self.requests, self.misses, self.lifecycle, self.plans, self.warm_results, self.dead_letter)


_FAMILY_TOPIC: Final[dict[str, Callable[[Topics], str]]] = {
    "request": lambda t: t.requests,
    "miss": lambda t: t.misses,
    "lifecycle": lambda t: t.lifecycle,
    "fleet": lambda t: t.lifecycle,
    "plan": lambda t: t.plans,
    "warm_result": lambda t: t.warm_results,
}


def partition_key(event: Event) -> bytes:
    """The key that keeps related events in order on one partition (design brief, section 4).

    Requests and misses: (tenant, model, root prefix), so one planner instance owns a prefix's
    counters. Lifecycle: the replica. Plans: the node. Fleet changes: the model.
    """
    if isinstance(event, RequestObserved | PrefixMissed):
        return f"{event.tenant}/{event.model.name}/{event.chain[0]}".encode()
    if isinstance(event, ReplicaEvent):
        return event.replica.encode()
    if isinstance(event, WarmPlanIssued):
        return event.node.encode()
    replica = getattr(event, "replica", None)
    if isinstance(replica, str):
        return replica.encode()
    return f"{event.tenant}/{event.model.name}".encode()


SIGNATURE_HEADER: Final = "warmplane-signature"
"""A control event's HMAC (`event_signing.py`)."""


class DeadLetterHeaders:
    """Header names on a dead-lettered message; its value is the original bytes, untouched."""

    REASON: Final = "warmplane-dlq-reason"
    SOURCE_TOPIC: Final = "warmplane-dlq-topic"
    SOURCE_PARTITION: Final = "warmplane-dlq-partition"
    SOURCE_OFFSET: Final = "warmplane-dlq-offset"
    CONSUMER: Final = "warmplane-dlq-consumer"
