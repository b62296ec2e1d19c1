"""A bounded window of the event ids most recently counted on one partition. Pure: no I/O.

A producer that retries a send after a timeout may publish an event twice; both copies land on the
same partition (same key), a few batches apart at most. The window remembers the last `capacity` ids
of a partition and so recognises such duplicates, in O(1) time and bounded memory.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterable


class RecentIds:
    """The last `capacity` ids added (as the 128-bit integers of the UUIDs), oldest forgotten first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._order: deque[int] = deque()
        self.ids: set[int] = set()
        """The ids in the window, for membership tests in C on a hot path. Read only: use `add`."""

    def __contains__(self, event_id: object) -> bool:
        return event_id in self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, event_id: int) -> None:
        """Remember `event_id` (the caller checked it is not already in the window)."""
        self.ids.add(event_id)
        self._order.append(event_id)
        if len(self._order) > self.capacity:
            self.ids.discard(self._order.popleft())

    def extend(self, event_ids: Iterable[int]) -> None:
        for event_id in event_ids:
            if event_id not in self.ids:
                self.add(event_id)


def pack_ids(event_ids: Iterable[uuid.UUID]) -> bytes:
    """Ids as the ledger stores them: 16 bytes each, concatenated."""
    return b"".join(event_id.bytes for event_id in event_ids)


def unpack_ids(packed: bytes) -> list[uuid.UUID]:
    """The inverse of `pack_ids`. Raises `ValueError` on a length that is not a multiple of 16."""
    if len(packed) % 16:
        raise ValueError("packed ids must be a multiple of 16 bytes")
    return [uuid.UUID(bytes=packed[at : at + 16]) for at in range(0, len(packed), 16)]
