"""The semantic tier's embedding from an OpenAI-compatible endpoint: vLLM serving all-MiniLM-L6-v2 gives the
same vectors as the gateway's own worker, so either can serve the tier (within one space each)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from warmplane.services.gateway.embedders import model_folder
from warmplane.services.gateway.embedding_worker import WorkerEmbedder
from warmplane.services.gateway.openai_embeddings import OpenAiEmbedder
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm

TEXTS = [
    "What is the capital of France?",
    "Which city is France's capital?",
    "How do I reset my password?",
    "Give me a recipe for banana bread",
]


async def test_vllm_serving_the_model_gives_the_workers_vectors_in_batches(
    embedding_engine: EmbeddedVllm,
) -> None:
    remote = OpenAiEmbedder(embedding_engine.base_url, "minilm", max_batch=8)
    worker = WorkerEmbedder(model_folder(), name="minilm")
    try:
        assert await remote.start() == 384
        before = remote.batches
        served = await asyncio.gather(*(remote.embed(text) for text in TEXTS * 5))
        assert remote.batches - before < len(TEXTS) * 5  # concurrent queries shared requests
        await worker.start()
        own = [await worker.embed(text) for text in TEXTS]
    finally:
        await remote.close()
        await worker.close()
    vectors = np.array(served[: len(TEXTS)])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert (np.sum(vectors * np.array(own), axis=1) > 0.9999).all()
    assert remote.name == "openai:minilm" != worker.name


async def test_a_model_the_endpoint_does_not_serve_fails_at_start_with_its_answer(
    embedding_engine: EmbeddedVllm,
) -> None:
    remote = OpenAiEmbedder(embedding_engine.base_url, "no-such-model")
    try:
        with pytest.raises(RuntimeError, match="404"):
            await remote.start()
    finally:
        await remote.close()
