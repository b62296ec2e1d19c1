"""A bounded window of the event ids most recently counted on one partition. Pure: no I/O.

A producer that retries a send after a timeout may publish an event twice; both copies land on the
same partition (same key), a few batches apart at most. The window remembers the last `capacity` ids
of a partition and so recognises such duplicates, in O(1) time and bounded memory.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterable
from itertools import repeat


class RecentIds:
    """At least the last `capacity` ids admitted (as the 128-bit integers of the UUIDs), kept in the
    chunks they were admitted in and forgotten a whole chunk at a time, oldest first: the set
    operations then run in C, and the window holds at most `capacity` plus its largest chunk."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._chunks: deque[list[int]] = deque()
        self._size = 0
        self.ids: set[int] = set()
        """The ids in the window, for membership tests in C on a hot path. Read only: use `admit`."""

    def __contains__(self, event_id: object) -> bool:
        return event_id in self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def admit(self, event_ids: list[int]) -> None:
        """Remember `event_ids`, distinct and not in the window (the caller checked), as one chunk."""
        if not event_ids:
            return
        self.ids.update(event_ids)
        self._chunks.append(event_ids)
        self._size += len(event_ids)
        while self._size - len(self._chunks[0]) >= self.capacity:
            oldest = self._chunks.popleft()
            self.ids.difference_update(oldest)
            self._size -= len(oldest)

    def add(self, event_id: int) -> None:
        """Remember one id (the caller checked it is not in the window)."""
        self.admit([event_id])

    def extend(self, event_ids: Iterable[int]) -> None:
        """Remember `event_ids` in order, skipping those already held."""
        self.admit([i for i in dict.fromkeys(event_ids) if i not in self.ids])


def pack_ids(event_ids: Iterable[int]) -> bytes:
    """Ids (the 128-bit integers of the UUIDs) as the ledger stores them: 16 bytes each, big-endian,
    concatenated: a UUID's `bytes`."""
    return b"".join(map(int.to_bytes, event_ids, repeat(16)))  # big-endian by default (3.11)


def unpack_ids(packed: bytes) -> list[uuid.UUID]:
    """The inverse of `pack_ids`. Raises `ValueError` on a length that is not a multiple of 16."""
    if len(packed) % 16:
        raise ValueError("packed ids must be a multiple of 16 bytes")
    return [uuid.UUID(bytes=packed[at : at + 16]) for at in range(0, len(packed), 16)]
