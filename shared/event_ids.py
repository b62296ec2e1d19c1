"""Event ids: UUIDv7 (RFC 9562), time-ordered, so the ledger and anything indexed by id grow in order."""

from __future__ import annotations

import os
import time
import uuid

_RAND_A_BITS = 12
_RAND_B_BITS = 62


def new_event_id(now_ns: int | None = None) -> uuid.UUID:
    """A fresh UUIDv7 for `now_ns` (nanoseconds since the epoch; the clock when None)."""
    ms = (time.time_ns() if now_ns is None else now_ns) // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    rand_a = rand >> (80 - _RAND_A_BITS)
    rand_b = rand & ((1 << _RAND_B_BITS) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    return uuid.UUID(int=value)
