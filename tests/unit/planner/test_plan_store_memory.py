"""The plan store's behaviour suite (`tests/plan_store_behaviour.py`) on the memory twin the unit tests
use; `tests/integration/planner/test_plan_store_pg.py` runs the same suite on Postgres."""

from __future__ import annotations

import pytest

from tests.plan_store_behaviour import BEHAVIOURS
from tests.unit.planner.memory_planner import MemoryPlans


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
async def test_the_memory_plan_store(behaviour: str) -> None:
    await BEHAVIOURS[behaviour](MemoryPlans())
