"""The engine client's behaviour suite (`tests/engine_client_behaviour.py`) on the memory twin the unit tests
use; `tests/integration/warmer/test_engine_client_vllm.py` runs the same suite on a real vLLM."""

from __future__ import annotations

import pytest

from tests.engine_client_behaviour import BEHAVIOURS, EngineWorld
from tests.unit.warmer.memory_engine import MemoryEngine


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
async def test_the_memory_engine(behaviour: str) -> None:
    engine = MemoryEngine()
    await BEHAVIOURS[behaviour](EngineWorld(engine, MemoryEngine(answering=False), engine.max_model_len))
