"""The choice store's behaviour suite (`tests/choice_store_behaviour.py`) on the memory twin the unit tests
use, seeded through the ingest store's twin; `tests/integration/planner/test_choice_store_pg.py` runs the
same suite on Postgres."""

from __future__ import annotations

import pytest

from tests.choice_store_behaviour import BEHAVIOURS, ChoiceWorld
from tests.ingest_store_behaviour import BUCKET_SECONDS
from tests.unit.planner.memory_ingest import MemoryIngest
from warmplane.services.planner.core.ingest_batch import fold_events
from warmplane.shared.events import Event


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
async def test_the_memory_choice_store(behaviour: str) -> None:
    ingest = MemoryIngest(bucket_seconds=BUCKET_SECONDS)

    async def write(events: list[Event]) -> None:
        await ingest.write([], fold_events(events, stored_nodes={}))

    await BEHAVIOURS[behaviour](ChoiceWorld(ingest.plans, write))
