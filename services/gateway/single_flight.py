"""Single flight: concurrent identical misses wait on one request's answer, in a process and across pods.

The first request to miss an answer key leads a `Flight`; requests for the same key that arrive while it
is in the air follow it and are handed its answer (or None: the leader got no answer to keep, and each
follower goes to a replica itself). A flight lands once, by `land`, at the latest when its leader's
request ends (`proxy.py` guarantees it); a flight past its deadline is never joined, so a leader that
never lands costs its followers `timeout_s` at most, not an error. Across pods, `Leases`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from warmplane.services.gateway.result_stores import AnswerStore
from warmplane.shared.redis_keys import RESULT_ANSWERS, RESULT_LEASES

_PRUNE_AT = 4_096
"""Flights in the air at which the table is pruned of those past their deadline."""


@dataclass(frozen=True, slots=True)
class Flight:
    answer: asyncio.Future[bytes | None]
    deadline: float
    """Monotonic seconds."""


class Flights:
    def __init__(self) -> None:
        self._flights: dict[str, Flight] = {}

    def __len__(self) -> int:
        return len(self._flights)

    def join(self, key: str, now: float, timeout_s: float) -> tuple[Flight, bool]:
        """The flight of `key` and whether the caller leads it (a new one, when none is in the air)."""
        found = self._flights.get(key)
        if found is not None and not found.answer.done() and found.deadline > now:
            return found, False
        if len(self._flights) >= _PRUNE_AT:
            self._prune(now)
        flight = Flight(asyncio.get_running_loop().create_future(), now + timeout_s)
        self._flights[key] = flight
        return flight, True

    def land(self, key: str, flight: Flight, answer: bytes | None) -> None:
        """Hand `answer` to the flight's followers (once: later calls change nothing)."""
        if not flight.answer.done():
            flight.answer.set_result(answer)
        if self._flights.get(key) is flight:
            del self._flights[key]

    @staticmethod
    async def wait(flight: Flight, now: float) -> bytes | None:
        """The flight's answer, or None if it lands without one or not by its deadline."""
        try:
            async with asyncio.timeout(max(flight.deadline - now, 0.0)):
                return await asyncio.shield(flight.answer)
        except TimeoutError:
            return None

    def _prune(self, now: float) -> None:
        for key in [key for key, flight in self._flights.items() if flight.deadline <= now]:
            del self._flights[key]


class Leases:
    """Single flight across pods: a flight's leader takes a Redis lease on its answer key for the
    flight's length (`take`); a pod whose leader finds the lease taken waits for that pod's answer in
    Redis (`await_answer`) while the lease lives, polling every `poll_s`."""

    def __init__(self, answers: AnswerStore, poll_s: float, monotonic: Callable[[], float]) -> None:
        self._answers = answers
        self._poll_s = poll_s
        self._monotonic = monotonic

    async def take(self, key: str, ttl_s: float) -> str | None:
        """The holder name of a lease on the answer key `key`, or None when another holds it."""
        holder = uuid.uuid4().hex
        return holder if await self._answers.lease(lease_key(key), holder, ttl_s) else None

    async def await_answer(
        self, key: str, deadline: float, read: Callable[[], Awaitable[bytes | None]]
    ) -> bytes | None:
        """What `read` finds once the lease on `key` is released, or before; None if it finds nothing
        by the lease's end or `deadline` (monotonic seconds). Raises what the store raises."""
        while True:
            answer = await read()
            if answer is not None:
                return answer
            if not await self._answers.held(lease_key(key)):  # released: kept just now, or given up
                return await read()
            if self._monotonic() >= deadline:
                return None
            await asyncio.sleep(self._poll_s)

    async def release(self, key: str, holder: str) -> None:
        await self._answers.release(lease_key(key), holder)


def lease_key(key: str) -> str:
    """The Redis key of the single-flight lease on the answer key `key`."""
    return RESULT_LEASES + key.removeprefix(RESULT_ANSWERS)
