"""The fleet store's behaviour suite (`tests/fleet_store_behaviour.py`) on the memory twin the unit tests
use; `tests/integration/planner/test_fleet_store_pg.py` runs the same suite on Postgres."""

from __future__ import annotations

import pytest

from tests.fleet_store_behaviour import BEHAVIOURS, FleetWorld
from tests.unit.planner.memory_planner import MemoryFleet, MemoryPlans


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
async def test_the_memory_fleet_store(behaviour: str) -> None:
    store = MemoryFleet(MemoryPlans(), [])
    await BEHAVIOURS[behaviour](FleetWorld(store, store.traffic))
