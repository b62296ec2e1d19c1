"""A replica driver stops when its warmer cancels it, even if a wake-up lands at the same moment.

On Python 3.11, `asyncio.wait_for` returns the inner result when the cancellation and the inner
completion meet in one loop iteration (gh-86296): the driver then went on watching, and the warmer's
stop waited for it forever (seen as a CI run that hung in `test_fleet_reactions`).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from tests.unit.warmer.memory_engine import MemoryEngine
from tests.unit.warmer.test_replica_tracker import tracker
from warmplane.services.warmer.metrics import WarmerMetrics
from warmplane.services.warmer.replica_driver import ReplicaDriver
from warmplane.services.warmer.settings import EngineSettings, WarmSettings
from warmplane.shared.cache_salt import SaltBook
from warmplane.shared.events import Event


async def test_a_cancel_that_meets_a_wake_up_still_stops_the_driver() -> None:
    published: list[Event] = []
    driver = ReplicaDriver(
        node="node-0",
        engine=EngineSettings(replica="replica-0", url="http://127.0.0.1:9", served_model="m"),
        client=MemoryEngine(answering=False),  # not answering yet: nothing warms
        tracker=tracker(),
        salts=SaltBook({}),
        warm=WarmSettings(health_interval_s=60, progress_interval_s=60),
        publish=published.append,
        metrics=WarmerMetrics(CollectorRegistry()),
        clock=lambda: datetime.now(UTC),
    )
    task = asyncio.create_task(driver.run())
    for _ in range(20):  # until it waits for a wake-up (its first step publishes the start)
        await asyncio.sleep(0)
    assert published, "the driver never took its first step"
    driver.wake()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(task), 5)
