"""How an answer is stored in Redis, so that a damaged or foreign value is known and never served. Pure.

A stored answer is `MAGIC`, then the BLAKE2b digest (16 bytes) of the answer, then the answer's bytes.
A value that does not start with `MAGIC`, or whose digest does not match (cut short, written by another
program, or by a format this code does not know), unpacks to None: the caller deletes it and counts it.
"""

from __future__ import annotations

import hashlib

MAGIC = b"wpa1"
_DIGEST_BYTES = 16
_HEAD = len(MAGIC) + _DIGEST_BYTES


def pack(answer: bytes) -> bytes:
    return MAGIC + _digest(answer) + answer


def unpack(stored: bytes) -> bytes | None:
    """The answer `pack` stored in `stored`, or None when `stored` is not such a value intact."""
    if len(stored) < _HEAD or not stored.startswith(MAGIC):
        return None
    answer = stored[_HEAD:]
    return answer if stored[len(MAGIC) : _HEAD] == _digest(answer) else None


def _digest(answer: bytes) -> bytes:
    return hashlib.blake2b(answer, digest_size=_DIGEST_BYTES).digest()
