"""The result cache's first layer (L1): exact answers in this process's memory, the least recently used
evicted first. Pure: the caller hands in `now` (monotonic seconds) and each entry's expiry.

Bounded twice: at most `max_entries` answers and at most `max_bytes` of them (an answer's bytes plus its
key's); an answer larger than `max_bytes` alone is not held. An entry past its expiry is never returned
and is dropped when met. Each entry remembers its namespace, so an epoch bump drops the old epoch's
entries at once (`drop_older`) instead of leaving them to age out.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from warmplane.services.gateway.result_keys import Namespace


@dataclass(frozen=True, slots=True)
class _Entry:
    answer: bytes
    namespace: Namespace
    expires_at: float
    size: int


class AnswerLru:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held_bytes(self) -> int:
        """Bytes held: answers and their keys."""
        return self._bytes

    def get(self, key: str, now: float) -> bytes | None:
        """The answer under `key` if it has not expired by `now`; marks it most recently used."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires_at <= now:
            self._remove(key)
            return None
        self._entries.move_to_end(key)
        return entry.answer

    def put(self, key: str, namespace: Namespace, answer: bytes, expires_at: float) -> None:
        """Hold `answer` until `expires_at`, evicting the least recently used entries to stay in bounds."""
        size = len(answer) + len(key)
        if size > self._max_bytes or self._max_entries == 0:
            return
        if key in self._entries:
            self._remove(key)
        self._entries[key] = _Entry(answer, namespace, expires_at, size)
        self._bytes += size
        while len(self._entries) > self._max_entries or self._bytes > self._max_bytes:
            self._remove(next(iter(self._entries)))

    def delete(self, key: str) -> None:
        if key in self._entries:
            self._remove(key)

    def drop_older(self, tenant: str, model: str, epoch: int) -> int:
        """Drop the entries of (tenant, model) from epochs before `epoch`; how many were dropped."""
        old = [
            key
            for key, entry in self._entries.items()
            if entry.namespace.epoch < epoch
            and (entry.namespace.tenant, entry.namespace.model) == (tenant, model)
        ]
        for key in old:
            self._remove(key)
        return len(old)

    def _remove(self, key: str) -> None:
        self._bytes -= self._entries.pop(key).size
