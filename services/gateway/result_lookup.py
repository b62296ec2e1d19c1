"""What the result cache tells the serving path about one request: `Lookup`, and its `Hit` if any."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from warmplane.services.gateway.result_keys import CacheQuery, Namespace, namespace_answers
from warmplane.services.gateway.single_flight import Flight

Tier = Literal["l1", "exact", "semantic", "flight"]
"""Where a hit came from: L1 (memory), L2 (exact, Redis), L3 (semantic, pgvector), or the answer of an
identical request in flight (this pod's or another's)."""


@dataclass(frozen=True, slots=True)
class Hit:
    answer: bytes
    tier: Tier
    similarity: float


@dataclass(slots=True)
class Lookup:
    """One request's dealings with the cache: its keys, what the lookup found, whether to keep, and its
    part in a single flight."""

    namespace: Namespace
    query: CacheQuery
    key: str
    """The answer's Redis key (`answer_key`)."""
    keep: bool
    hit: Hit | None = None
    vector: list[float] | None = None
    flight: Flight | None = None
    leads: bool = False
    """This request leads its flight: its answer (`keep`) or its failure (`abandon`) lands it."""
    lease: str | None = None
    """This request's holder name while it holds the flight's Redis lease."""
    remote: bool = False
    """Another pod holds the lease: `ResultCache.follow` waits for that pod's answer in Redis."""

    @property
    def follows(self) -> bool:
        """The request must await `ResultCache.follow` before it goes to a replica."""
        return self.hit is None and self.flight is not None and (self.remote or not self.leads)


def answer_key(namespace: Namespace, exact: str) -> str:
    """The Redis key of an answer: unambiguous whatever characters a tenant or model name holds."""
    material = "\0".join((namespace.tenant, namespace.model, str(namespace.epoch), exact))
    return namespace_answers(namespace) + hashlib.sha256(material.encode()).hexdigest()
