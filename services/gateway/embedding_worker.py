"""The learned embedder: a sentence encoder in a worker process beside the gateway, fed in batches.

Why a process: encoding a query is milliseconds of CPU (`bert_encoder.py`), and part of it is numpy's
element-wise work that holds the GIL; in the gateway's own process that would stall its event loop, which
relays every stream. A worker process keeps the loop free; a query and its vector cross the pipe in
microseconds (`bench/embedding_bench.py` measures both placements).

Why batches: concurrent queries wait in one queue while the worker encodes, and go to it together, up to
`max_batch`: a batch of 8 costs about half as much a query as 8 alone. Nobody waits for a batch to fill:
the worker takes whatever is queued when it becomes free.

A worker that dies is replaced on the next query; the queries it held fail (the cache counts them and
serves them from a replica). Waiters that give up (the cache's timeout) are skipped when results come back.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
from collections import deque
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from warmplane.services.gateway.bert_encoder import BertEncoder

log = logging.getLogger(__name__)
Placement = Literal["process", "thread"]
"""Where the encoder runs: a worker process (the default), or a thread of the gateway's own process (the
benchmark's comparison; its element-wise work then takes the GIL from the event loop)."""
_loaded_encoder: dict[str, BertEncoder] = {}
"""The worker process's encoder (one, under "encoder"), loaded by `_load`."""


def _load(folder: str) -> None:
    """The worker's initializer: one BLAS thread (the worker is one core's worth of work beside the
    gateway's), then the model. numpy is imported here, after the variables are set: nothing the gateway's
    main module imports (which a spawned worker imports again) may import it."""
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    os.environ["OMP_NUM_THREADS"] = "1"
    from warmplane.services.gateway.bert_encoder import BertEncoder  # noqa: PLC0415 (after the variables)

    _loaded_encoder["encoder"] = BertEncoder(Path(folder))


def _encode(texts: list[str]) -> list[list[float]]:
    """In the worker: the batch's unit vectors."""
    return [row.tolist() for row in _loaded().encode(texts)]


def _dimensions() -> int:
    return _loaded().dimensions


def _loaded() -> BertEncoder:
    encoder = _loaded_encoder.get("encoder")
    if encoder is None:
        raise RuntimeError("the embedding worker's initializer did not run")
    return encoder


class WorkerEmbedder:
    """`Embedder` over a BERT-family model folder, encoded in one worker process (see the module)."""

    def __init__(
        self, folder: Path, *, name: str, max_batch: int = 32, placement: Placement = "process"
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._placement = placement
        self._folder = folder
        self._name = name
        self._max_batch = max_batch
        self._queue: deque[tuple[str, asyncio.Future[list[float]]]] = deque()
        self._executor: Executor | None = None
        self._draining: asyncio.Task[None] | None = None
        self.batches = 0
        """Batches encoded (for tests and the benchmark: how much batching happened)."""

    @property
    def name(self) -> str:
        return self._name

    async def start(self) -> int:
        """Start the worker and load the model (seconds: the gateway does it before it reports ready);
        the vectors' dimensions."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker(), _dimensions)

    async def embed(self, text: str) -> list[float]:
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        self._queue.append((text, future))
        if self._draining is None or self._draining.done():
            self._draining = asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            batch = [self._queue.popleft() for _ in range(min(self._max_batch, len(self._queue)))]
            batch = [(text, future) for text, future in batch if not future.done()]
            if not batch:
                continue
            try:
                vectors = await loop.run_in_executor(self._worker(), _encode, [text for text, _ in batch])
            except BrokenProcessPool as exc:
                log.warning("the embedding worker died (%s): a new one starts on the next query", exc)
                self._executor = None
                _fail(batch, exc)
                continue
            except Exception as exc:  # the model's own error: these queries miss, the next batch may not
                _fail(batch, exc)
                continue
            self.batches += 1
            for (_, future), vector in zip(batch, vectors, strict=True):
                if not future.done():
                    future.set_result(vector)

    def _worker(self) -> Executor:
        if self._executor is None:
            if self._placement == "thread":
                self._executor = ThreadPoolExecutor(1, initializer=_load, initargs=(str(self._folder),))
            else:
                self._executor = ProcessPoolExecutor(
                    max_workers=1,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_load,
                    initargs=(str(self._folder),),
                )
        return self._executor

    @property
    def pid(self) -> int | None:
        """The worker process's id (None before the first query, or in thread placement)."""
        processes = getattr(self._executor, "_processes", None) or {}
        return next(iter(processes), None)

    def kill(self) -> None:
        """Kill the worker process at once (for tests of a worker that dies)."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)

    async def close(self) -> None:
        """Stop the worker; queries still queued fail with `RuntimeError`."""
        _fail(list(self._queue), RuntimeError("the embedder is closed"))
        self._queue.clear()
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown)


def _fail(batch: list[tuple[str, asyncio.Future[list[float]]]], exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
