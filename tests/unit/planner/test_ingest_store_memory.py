"""The ingest store's behaviour suite (`tests/ingest_store_behaviour.py`) on the memory twin the unit tests
use; `tests/integration/planner/test_ingest_store_pg.py` runs the same suite on Postgres."""

from __future__ import annotations

import pytest

from tests.ingest_store_behaviour import BEHAVIOURS, BUCKET_SECONDS, IngestWorld
from tests.unit.planner.memory_ingest import MemoryIngest


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
async def test_the_memory_ingest_store(behaviour: str) -> None:
    store = MemoryIngest(bucket_seconds=BUCKET_SECONDS)
    await BEHAVIOURS[behaviour](IngestWorld(store, store.plans))
