"""Kafka topic names, partition keys and dead-letter headers: the one place they are spelled."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from warmplane.shared.events import (
    EVENT_TYPES,
    Event,
    PrefixMissed,
    ReplicaEvent,
    ReplicaHeartbeat,
    ReplicaResidency,
    ReplicaRewarmRequested,
    RequestObserved,
    WarmFinished,
    WarmPlanIssued,
    WarmProgressed,
)


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
    def heartbeats(self) -> str:
        """Warmers' word that their replicas live (`replica.heartbeat`): read by planners, never replayed by
        routers as the lifecycle topic is, and kept only `HEARTBEAT_RETENTION_MS`."""
        return f"{self.prefix}{HEARTBEATS_SUFFIX}"

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
        return self.for_family(event.FAMILY)

    def for_family(self, family: str) -> str:
        """The topic of the events of `family` (an event type's `FAMILY`)."""
        return _FAMILY_TOPIC[family](self)

    def all(self) -> tuple[str, ...]:
        return (
            self.requests,
            self.misses,
            self.lifecycle,
            self.heartbeats,
            self.plans,
            self.warm_results,
            self.dead_letter,
        )


HEARTBEATS_SUFFIX: Final = ".heartbeats"
HEARTBEAT_RETENTION_MS: Final = 3_600_000
"""A heartbeat says something for a minute at most; an hour of them is plenty to look back on."""


def topic_configs(topic: str) -> dict[str, str]:
    """The configuration a topic of Warmplane's is created with (the broker's defaults otherwise)."""
    return {"retention.ms": str(HEARTBEAT_RETENTION_MS)} if topic.endswith(HEARTBEATS_SUFFIX) else {}


_FAMILY_TOPIC: Final[dict[str, Callable[[Topics], str]]] = {
    "request": lambda t: t.requests,
    "miss": lambda t: t.misses,
    "lifecycle": lambda t: t.lifecycle,
    "heartbeat": lambda t: t.heartbeats,
    "fleet": lambda t: t.lifecycle,
    "plan": lambda t: t.plans,
    "warm_result": lambda t: t.warm_results,
}


@dataclass(frozen=True, slots=True)
class KeyRule:
    """The partition key of some event types: what it is (the published contract says it) and how it is
    made from an event."""

    events: tuple[type[Event], ...]
    says: str
    make: Callable[[Any], str]


KEY_RULES: Final = (
    KeyRule(
        (RequestObserved, PrefixMissed),
        "{tenant}/{model.name}/{chain[0]}: one planner instance owns a root prefix's counters",
        lambda e: f"{e.tenant}/{e.model.name}/{e.chain[0]}",
    ),
    KeyRule(
        (ReplicaEvent, ReplicaHeartbeat),
        "{replica}: a replica's lifecycle in order",
        lambda e: e.replica,
    ),
    KeyRule((WarmPlanIssued,), "{node}: a node's plans in order, to its warmer", lambda e: e.node),
    KeyRule(
        (ReplicaRewarmRequested, WarmProgressed, WarmFinished, ReplicaResidency),
        "{replica}: a replica's results in order",
        lambda e: e.replica,
    ),
    KeyRule(
        (Event,),
        "{tenant}/{model.name}: a model's fleet changes in order",
        lambda e: f"{e.tenant}/{e.model.name}",
    ),
)
"""The first rule whose `events` an event type is one of gives its key (design brief, section 4)."""


def key_rule(event_type: type[Event]) -> KeyRule:
    return _RULE_OF[event_type]


def partition_key(event: Event) -> bytes:
    """The key that keeps related events in order on one partition (`KEY_RULES`)."""
    return _RULE_OF[type(event)].make(event).encode()


_RULE_OF: Final[dict[type[Event], KeyRule]] = {
    cls: next(rule for rule in KEY_RULES if issubclass(cls, rule.events)) for cls in EVENT_TYPES.values()
}


SIGNATURE_HEADER: Final = "warmplane-signature"
"""A control event's HMAC (`event_signing.py`)."""


class DeadLetterHeaders:
    """Header names on a dead-lettered message; its value is the original bytes, untouched."""

    REASON: Final = "warmplane-dlq-reason"
    SOURCE_TOPIC: Final = "warmplane-dlq-topic"
    SOURCE_PARTITION: Final = "warmplane-dlq-partition"
    SOURCE_OFFSET: Final = "warmplane-dlq-offset"
    CONSUMER: Final = "warmplane-dlq-consumer"
