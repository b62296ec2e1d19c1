"""Concurrent queries to an embedding model, handed over in batches.

Queries wait in one queue while the model encodes; when it is free it takes whatever is queued, up to
`max_batch`, as one call. Nobody waits for a batch to fill, so a lone query goes at once, and under load a
batch costs less a query than its queries one by one. A failed call fails the queries it held (the cache
counts them and serves them from a replica); the next batch is tried afresh. Waiters that gave up (the
cache's timeout) are left out of the batch, or skipped when its results come back.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

EncodeBatch = Callable[[list[str]], Awaitable[list[list[float]]]]
"""One call to the model: a vector for each text, in order."""


class BatchQueue:
    """The queue in front of one `EncodeBatch` (see the module)."""

    def __init__(self, encode: EncodeBatch, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._encode = encode
        self._max_batch = max_batch
        self._queue: deque[tuple[str, asyncio.Future[list[float]]]] = deque()
        self._draining: asyncio.Task[None] | None = None
        self.batches = 0
        """Calls made (for tests and the benchmark: how much batching happened)."""

    async def embed(self, text: str) -> list[float]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[float]] = loop.create_future()
        self._queue.append((text, future))
        if self._draining is None or self._draining.done():
            self._draining = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            batch = [self._queue.popleft() for _ in range(min(self._max_batch, len(self._queue)))]
            batch = [(text, future) for text, future in batch if not future.done()]
            if not batch:
                continue
            try:
                vectors = await self._encode([text for text, _ in batch])
                if len(vectors) != len(batch):
                    raise ValueError(f"the model returned {len(vectors)} vectors for {len(batch)} texts")
            except Exception as exc:  # whatever the model or its transport raises fails this batch only
                _fail(batch, exc)
                continue
            self.batches += 1
            for (_, future), vector in zip(batch, vectors, strict=True):
                if not future.done():
                    future.set_result(vector)

    def fail_waiting(self, exc: BaseException) -> None:
        """Fail every query still queued (at close)."""
        _fail(list(self._queue), exc)
        self._queue.clear()


def _fail(batch: list[tuple[str, asyncio.Future[list[float]]]], exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
