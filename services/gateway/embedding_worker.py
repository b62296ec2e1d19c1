"""The learned embedder: a sentence encoder in a worker process beside the gateway, fed in batches
(`embedding_batches.py`).

Why a process: encoding a query is milliseconds of CPU (`bert_encoder.py`), part of it numpy's element-wise
work that holds the GIL, and the model is native code with its own memory and threads. A worker process
keeps all of that out of the gateway, which relays every stream: the worker's BLAS is held to one thread,
and a crash in it costs a few queries, not the gateway. Measured side by side (`bench.embedding_bench`), the
event loop's lag is about the same with the model in a thread of the gateway on two cores, which encodes a
fifth more queries a second by letting BLAS take both cores from the loop; a query and its vector cross the
pipe in well under a millisecond. Isolation decides it.

A worker that dies is replaced on the next query; the queries it held fail (the cache counts them and
serves them from a replica).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from warmplane.services.gateway.embedding_batches import BatchQueue

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
        self._placement = placement
        self._folder = folder
        self._name = name
        self._executor: Executor | None = None
        self._queue = BatchQueue(self._encode, max_batch)

    @property
    def name(self) -> str:
        return self._name

    @property
    def batches(self) -> int:
        """Batches encoded (for tests and the benchmark)."""
        return self._queue.batches

    async def start(self) -> int:
        """Start the worker and load the model (seconds: the gateway does it before it reports ready);
        the vectors' dimensions."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker(), _dimensions)

    async def embed(self, text: str) -> list[float]:
        return await self._queue.embed(text)

    async def _encode(self, texts: list[str]) -> list[list[float]]:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker(), _encode, texts)
        except BrokenProcessPool as exc:
            log.warning("the embedding worker died (%s): a new one starts on the next query", exc)
            self._executor = None
            raise

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
        self._queue.fail_waiting(RuntimeError("the embedder is closed"))
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown)
