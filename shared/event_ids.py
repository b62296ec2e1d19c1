"""Event ids: UUIDv7 (RFC 9562), time-ordered so the idempotency index grows at its right edge."""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime

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


def event_id_floor(at: datetime) -> uuid.UUID:
    """The smallest UUIDv7 of the millisecond `at`: ids below it were made before `at`."""
    ms = int(at.astimezone(UTC).timestamp() * 1000)
    return uuid.UUID(int=(ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | 0b10 << 62)
