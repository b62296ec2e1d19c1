"""Single flight within a process: followers get the leader's answer, or None, never an error."""

from __future__ import annotations

import asyncio

from warmplane.services.gateway.single_flight import Flights


async def test_requests_for_a_key_in_flight_follow_its_leader_and_get_its_answer() -> None:
    flights = Flights()
    flight, leads = flights.join("k", now=0.0, timeout_s=30)
    followers = [flights.join("k", now=1.0, timeout_s=30) for _ in range(19)]
    assert leads and not any(follows for _, follows in followers)
    assert all(joined is flight for joined, _ in followers)
    waits = [asyncio.ensure_future(Flights.wait(joined, now=1.0)) for joined, _ in followers]
    flights.land("k", flight, b"answer")
    assert await asyncio.gather(*waits) == [b"answer"] * 19
    assert len(flights) == 0
    _, leads_again = flights.join("k", now=2.0, timeout_s=30)
    assert leads_again, "a landed flight is never joined"


async def test_a_leader_without_an_answer_sends_its_followers_on() -> None:
    flights = Flights()
    flight, _ = flights.join("k", now=0.0, timeout_s=30)
    follower, _ = flights.join("k", now=0.0, timeout_s=30)
    waiting = asyncio.ensure_future(Flights.wait(follower, now=0.0))
    flights.land("k", flight, None)
    flights.land("k", flight, b"late")  # a flight lands once
    assert await waiting is None


async def test_a_flight_past_its_deadline_is_waited_on_no_longer_and_not_joined() -> None:
    flights = Flights()
    flight, _ = flights.join("k", now=0.0, timeout_s=0.01)
    assert await Flights.wait(flight, now=0.0) is None  # its leader never landed it
    newer, leads = flights.join("k", now=0.02, timeout_s=30)
    assert leads and newer is not flight
    flights.land("k", flight, b"stale")  # the old leader lands late: the newer flight stays in the air
    assert len(flights) == 1 and not newer.answer.done()
