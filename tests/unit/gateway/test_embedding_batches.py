"""The batch queue in front of an embedding model: batching, failures and waiters that gave up."""

from __future__ import annotations

import asyncio

import pytest

from warmplane.services.gateway.embedding_batches import BatchQueue


class Model:
    """Encodes each text as [len(text)]; fails a batch holding "boom"; records each call's texts."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def encode(self, texts: list[str]) -> list[list[float]]:
        self.calls.append(texts)
        await self.gate.wait()
        if "boom" in texts:
            raise RuntimeError("model failed")
        return [[float(len(text))] for text in texts]


async def test_queries_arriving_while_the_model_works_go_together_each_getting_its_own_vector() -> None:
    model = Model()
    queue = BatchQueue(model.encode, max_batch=4)
    model.gate.clear()
    first = asyncio.create_task(queue.embed("a"))
    await asyncio.sleep(0)  # the first call is with the model
    rest = [asyncio.create_task(queue.embed("b" * n)) for n in range(2, 8)]
    await asyncio.sleep(0)
    model.gate.set()
    assert await first == [1.0]
    assert [await task for task in rest] == [[float(n)] for n in range(2, 8)]
    assert [len(call) for call in model.calls] == [1, 4, 2]  # at most max_batch a call, no waiting to fill
    assert queue.batches == 3


async def test_a_failed_batch_fails_only_its_own_queries() -> None:
    model = Model()
    queue = BatchQueue(model.encode, max_batch=2)
    model.gate.clear()
    held = asyncio.create_task(queue.embed("x"))
    await asyncio.sleep(0)
    doomed = [asyncio.create_task(queue.embed(text)) for text in ("boom", "y")]
    fine = asyncio.create_task(queue.embed("zz"))
    await asyncio.sleep(0)
    model.gate.set()
    assert await held == [1.0]
    for task in doomed:
        with pytest.raises(RuntimeError, match="model failed"):
            await task
    assert await fine == [2.0]


async def test_a_waiter_that_gave_up_is_left_out_of_the_next_batch() -> None:
    model = Model()
    queue = BatchQueue(model.encode, max_batch=8)
    model.gate.clear()
    held = asyncio.create_task(queue.embed("x"))
    await asyncio.sleep(0)
    given_up = asyncio.create_task(queue.embed("gone"))
    kept = asyncio.create_task(queue.embed("kept"))
    await asyncio.sleep(0)
    given_up.cancel()
    model.gate.set()
    await held
    assert await kept == [4.0]
    assert model.calls == [["x"], ["kept"]]


async def test_a_model_that_returns_the_wrong_number_of_vectors_fails_the_batch() -> None:
    async def short(texts: list[str]) -> list[list[float]]:
        return [[1.0]]

    queue = BatchQueue(short, max_batch=8)
    results = await asyncio.gather(queue.embed("a"), queue.embed("b"), return_exceptions=True)
    assert all(isinstance(result, ValueError) for result in results)


def test_a_batch_of_none_is_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        BatchQueue(Model().encode, max_batch=0)
