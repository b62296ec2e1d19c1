"""The numpy encoder against the model's reference implementation, and the worker that feeds it batches.

The reference vectors (`data/minilm_reference.json`) were computed once with transformers' `BertModel` on
torch from the same weights, pooled and normalised as sentence-transformers does; the file says so.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import pytest

from warmplane.services.gateway.bert_encoder import BertEncoder
from warmplane.services.gateway.embedders import model_folder
from warmplane.services.gateway.embedding_worker import WorkerEmbedder

REFERENCE = json.loads((Path(__file__).parent / "data" / "minilm_reference.json").read_text())


@pytest.fixture(scope="module")
def encoder() -> BertEncoder:
    return BertEncoder(model_folder())


def test_vectors_match_the_reference_implementation(encoder: BertEncoder) -> None:
    vectors = encoder.encode(REFERENCE["texts"])
    assert vectors.shape == (len(REFERENCE["texts"]), 384)
    assert np.allclose(vectors[:, :16], np.array(REFERENCE["leading"]), atol=1e-5)
    assert np.allclose(vectors @ vectors.T, np.array(REFERENCE["cosine"]), atol=1e-5)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_a_text_encodes_alike_alone_and_padded_in_a_batch(encoder: BertEncoder) -> None:
    short, long = "capital of France?", "What is the capital city of France, and how large is it today?"
    together = encoder.encode([short, long])
    assert np.allclose(together[0], encoder.encode([short])[0], atol=1e-5)
    assert np.allclose(together[1], encoder.encode([long])[0], atol=1e-5)


def test_a_text_past_the_longest_input_is_truncated_not_refused(encoder: BertEncoder) -> None:
    vectors = encoder.encode(["word " * (encoder.max_tokens * 2)])
    assert vectors.shape == (1, 384) and np.isfinite(vectors).all()


async def test_concurrent_queries_go_to_the_worker_in_batches_and_get_their_own_vectors(
    encoder: BertEncoder,
) -> None:
    texts = [f"how do I reset the password of account {n}?" for n in range(20)]
    worker = WorkerEmbedder(model_folder(), name="minilm", max_batch=8)
    try:
        assert await worker.start() == 384
        vectors = await asyncio.gather(*(worker.embed(text) for text in texts))
    finally:
        await worker.close()
    assert np.allclose(np.array(vectors), encoder.encode(texts), atol=1e-5)
    assert 3 <= worker.batches < len(texts)  # 8 at most a batch: at least 3; batched: fewer than 20


async def test_a_worker_that_dies_fails_its_queries_and_is_replaced(encoder: BertEncoder) -> None:
    worker = WorkerEmbedder(model_folder(), name="minilm")
    try:
        await worker.start()
        first = worker.pid
        assert first is not None
        worker.kill()
        with pytest.raises(BrokenProcessPool):
            await worker.embed("lost with the worker")
        vector = await worker.embed("served by the next worker")
        assert worker.pid not in (None, first)
    finally:
        await worker.close()
    assert np.allclose(vector, encoder.encode(["served by the next worker"])[0], atol=1e-5)
