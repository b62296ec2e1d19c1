"""The emitter's buffer and its accounts: what `emit()` fills, what the sender drains, what went where.

Every event handed to `emit()` ends in exactly one account, so the counts add up:

    emit() calls == emitted + rejected                (rejected: dropped before buffering)
    emitted      == sent + lost + buffered            (lost: dropped after buffering)

Single-threaded by contract: only the event loop's thread touches a ledger.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class DropReason(StrEnum):
    """Why an event was not delivered. The first four reject an event in `emit()`; the rest lose it later."""

    BUFFER_FULL = "buffer_full"
    ENCODE_ERROR = "encode_error"
    TOO_LARGE = "too_large"
    CLOSED = "closed"
    SEND_FAILED = "send_failed"
    SHUTDOWN = "shutdown"


REJECTED: Final = frozenset(
    {DropReason.BUFFER_FULL, DropReason.ENCODE_ERROR, DropReason.TOO_LARGE, DropReason.CLOSED}
)


class TopicQueue:
    """One topic's buffered events, oldest first: `keys[i]` is the partition key of `values[i]`.

    Two flat lists rather than a list of pairs: appending allocates no object the GC must track, so the
    hot path triggers no collection, and the sender takes a whole queue by swapping the lists.
    """

    __slots__ = ("keys", "values")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.values: list[bytes] = []

    def take(self, limit: int) -> tuple[list[bytes], list[bytes]]:
        """Remove and return the oldest `limit` events (all of them if fewer)."""
        keys, values = self.keys, self.values
        if len(keys) <= limit:
            self.keys, self.values = [], []
            return keys, values
        taken = keys[:limit], values[:limit]
        del keys[:limit], values[:limit]
        return taken


@dataclass(frozen=True, slots=True)
class EmitterStats:
    """A snapshot of an emitter's counters; `buffered` counts events queued, in flight or awaiting a retry.

    `connected` is True from the producer's first successful start until `close()` (aiokafka reconnects by
    itself meanwhile, so a broker outage shows as failed sends and drops, not as `connected` False).
    """

    emitted: int
    sent: int
    dropped: Mapping[DropReason, int]
    payloads_stripped: int
    buffered: int
    connected: bool

    @property
    def rejected(self) -> int:
        """Events `emit()` refused (it returned False)."""
        return sum(count for reason, count in self.dropped.items() if reason in REJECTED)

    @property
    def lost(self) -> int:
        """Events accepted by `emit()` and dropped later (failed sends, shutdown)."""
        return sum(count for reason, count in self.dropped.items() if reason not in REJECTED)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


class Ledger:
    """The bounded buffer shared by `Emitter.emit` (producer side) and the sender task (consumer side).

    `pending_events` / `pending_bytes` count every event emitted and not yet settled (sent or lost), so the
    bounds hold for queued, in-flight and retrying events alike. Attributes are public for the hot path.
    """

    def __init__(self) -> None:
        self.queues: dict[str, TopicQueue] = {}
        self.pending_events = 0
        self.pending_bytes = 0
        self.sent = 0
        self.payloads_stripped = 0
        self.dropped: dict[DropReason, int] = dict.fromkeys(DropReason, 0)
        self.connected = False
        # The sender sets `sender_idle` before it waits on `wake`; emit() sets `wake` only then, once.
        self.sender_idle = False
        self.wake = asyncio.Event()

    def queue_for(self, topic: str) -> TopicQueue:
        """The queue of `topic`'s buffered events, created on first use."""
        queue = self.queues.get(topic)
        if queue is None:
            queue = self.queues[topic] = TopicQueue()
        return queue

    def queued(self) -> int:
        """Events waiting in the queues (not yet taken by the sender)."""
        return sum(len(queue.keys) for queue in self.queues.values())

    def wake_sender(self) -> None:
        if self.sender_idle:
            self.sender_idle = False
            self.wake.set()

    def settle_sent(self, events: int, nbytes: int) -> None:
        self.pending_events -= events
        self.pending_bytes -= nbytes
        self.sent += events

    def settle_lost(self, reason: DropReason, events: int, nbytes: int) -> None:
        self.pending_events -= events
        self.pending_bytes -= nbytes
        self.dropped[reason] += events

    def drop_queued(self, reason: DropReason) -> int:
        """Settle every still-queued event as lost for `reason`; return how many there were."""
        events = nbytes = 0
        for queue in self.queues.values():
            keys, values = queue.take(len(queue.keys))
            events += len(keys)
            nbytes += value_bytes(values)
        self.settle_lost(reason, events, nbytes)
        return events

    def snapshot(self) -> EmitterStats:
        # `emitted` is not counted on the hot path: every emitted event is sent, lost or still pending.
        lost = sum(count for reason, count in self.dropped.items() if reason not in REJECTED)
        return EmitterStats(
            emitted=self.sent + self.pending_events + lost,
            sent=self.sent,
            dropped=dict(self.dropped),
            payloads_stripped=self.payloads_stripped,
            buffered=self.pending_events,
            connected=self.connected,
        )


def value_bytes(values: Iterable[bytes]) -> int:
    """The size of encoded events, as `pending_bytes` counts it."""
    return sum(map(len, values))
