"""A replica's drain: draining, then stopped once its engine says no request is in flight, or once the
engine is gone, or at the drain's timeout; each says which in its reason."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from tests.unit.warmer.memory_engine import MemoryEngine
from tests.unit.warmer.test_replica_tracker import tracker
from warmplane.services.warmer.core.replica import Phase
from warmplane.services.warmer.metrics import WarmerMetrics
from warmplane.services.warmer.replica_driver import ReplicaDriver
from warmplane.services.warmer.settings import EngineSettings, WarmSettings
from warmplane.shared.cache_salt import SaltBook
from warmplane.shared.events import Event, ReplicaEvent


class _DrainingEngine(MemoryEngine):
    """A memory engine whose `/metrics` reports `counts` requests in flight in turn (the last one from then
    on), while it is `answering`."""

    def __init__(self, counts: list[int | None], *, answering: bool = True) -> None:
        super().__init__(answering=answering)
        self._counts: Iterator[int | None] = iter(counts)
        self._last: int | None = None
        self.asked = 0

    async def requests_in_flight(self) -> int | None:
        self.asked += 1
        self._last = next(self._counts, self._last)
        return self._last


def driving(engine: _DrainingEngine, published: list[Event]) -> ReplicaDriver:
    return ReplicaDriver(
        node="node-0",
        engine=EngineSettings(replica="replica-0", url="http://127.0.0.1:9", served_model="m"),
        client=engine,
        tracker=tracker(),
        salts=SaltBook({}),
        warm=WarmSettings(),
        publish=published.append,
        metrics=WarmerMetrics(CollectorRegistry()),
        clock=lambda: datetime.now(UTC),
    )


async def drained(engine: _DrainingEngine, *, timeout_s: float = 30.0) -> list[ReplicaEvent]:
    published: list[Event] = []
    driver = driving(engine, published)
    await driver.drain("SIGTERM", settle_s=0, timeout_s=timeout_s)
    assert driver.tracker.phase is Phase.STOPPED
    return [event for event in published if isinstance(event, ReplicaEvent)]


async def test_stopped_follows_draining_once_the_engine_has_no_request_in_flight() -> None:
    engine = _DrainingEngine([2, 1, 0])

    draining, stopped = await drained(engine)

    assert (draining.STATE, draining.reason) == ("draining", "SIGTERM")
    assert (stopped.STATE, stopped.reason) == ("gone", "drained: no request in flight")
    assert engine.asked == 3


async def test_an_engine_that_is_gone_is_drained() -> None:
    (_, stopped) = await drained(_DrainingEngine([None], answering=False))

    assert stopped.reason == "drained: the engine no longer answers"


@pytest.mark.parametrize(("counts", "said"), [([3], "3"), ([None], "an unknown number of")])
async def test_a_drain_that_outlasts_its_timeout_stops_anyway_and_says_how_many_were_left(
    counts: list[int | None], said: str
) -> None:
    (_, stopped) = await drained(_DrainingEngine(counts), timeout_s=0.01)

    assert stopped.reason == f"drain timed out after 0.01 s with {said} requests in flight"


async def test_a_replica_sends_heartbeats_while_it_drains_and_none_once_stopped() -> None:
    driver = driving(_DrainingEngine([1, 0]), [])
    driver.tracker.start()
    starting = driver.heartbeat()
    assert starting is not None and (starting.replica, starting.node, starting.state) == (
        "replica-0",
        "node-0",
        "starting",
    )
    driver.tracker.drain("SIGTERM")
    draining = driver.heartbeat()
    assert draining is not None and draining.state == "draining"
    await driver.drain("SIGTERM", settle_s=0, timeout_s=30)
    assert driver.heartbeat() is None
