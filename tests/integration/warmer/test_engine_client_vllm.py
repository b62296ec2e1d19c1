"""The engine client's behaviour suite (`tests/engine_client_behaviour.py`) on the session's real vLLM
(CPU, the tiny model) through `VllmEngineClient`; the engine that does not answer is a port nobody listens
on."""

from __future__ import annotations

import pytest

from tests.engine_client_behaviour import BEHAVIOURS, EngineWorld
from warmplane.services.warmer.vllm_client import VllmEngineClient
from warmplane.shared.embedded.processes import free_port
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, MAX_MODEL_LEN, EmbeddedVllm


def _client(base_url: str, model: str) -> VllmEngineClient:
    return VllmEngineClient(
        base_url,
        model,
        connect_timeout_s=1.0,
        request_timeout_s=60.0,
        health_timeout_s=1.0,
        block_size=BLOCK_SIZE,
    )


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
async def test_the_real_engine(behaviour: str, vllm_engine: EmbeddedVllm) -> None:
    async with (
        _client(vllm_engine.base_url, vllm_engine.model_name) as engine,
        _client(f"http://127.0.0.1:{free_port()}", vllm_engine.model_name) as absent,
    ):
        await BEHAVIOURS[behaviour](EngineWorld(engine, absent, MAX_MODEL_LEN))
