"""All three embedded parts together, as the main job and the test harness start them.

Contract: ``EmbeddedStack`` starts Kafka, Postgres and Redis in that order under one workdir and stops
them in reverse order on exit; if one fails to start, the ones already running are stopped before the
error propagates. With no workdir a temporary folder is used and removed after everything stopped.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

from warmplane.shared.embedded.kafka_broker import EmbeddedKafka
from warmplane.shared.embedded.postgres_server import EmbeddedPostgres
from warmplane.shared.embedded.redis_server import EmbeddedRedis


class EmbeddedStack:
    """Kafka, Postgres and Redis under ``workdir`` (``kafka/``, ``postgres/``, ``redis/``)."""

    def __init__(
        self, workdir: Path | None = None, *, postgres_settings: Mapping[str, str] | None = None
    ) -> None:
        self._workdir = workdir
        self._postgres_settings = postgres_settings
        self._exit_stack: contextlib.ExitStack | None = None
        self._kafka: EmbeddedKafka | None = None
        self._postgres: EmbeddedPostgres | None = None
        self._redis: EmbeddedRedis | None = None

    @property
    def kafka(self) -> EmbeddedKafka:
        """The running broker; raises before ``start()``."""
        return _started(self._kafka, "kafka")

    @property
    def postgres(self) -> EmbeddedPostgres:
        """The running Postgres server; raises before ``start()``."""
        return _started(self._postgres, "postgres")

    @property
    def redis(self) -> EmbeddedRedis:
        """The running Redis server; raises before ``start()``."""
        return _started(self._redis, "redis")

    def start(self) -> None:
        """Start all parts, or none: a failure stops what already started and re-raises."""
        if self._exit_stack is not None:
            raise RuntimeError("EmbeddedStack already started")
        try:
            self._start_all()
        except BaseException:
            self._kafka = self._postgres = self._redis = None
            raise

    def _start_all(self) -> None:
        with contextlib.ExitStack() as stack:
            root = self._workdir
            if root is None:
                root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="warmplane-")))
            self._kafka = stack.enter_context(EmbeddedKafka(root / "kafka"))
            self._postgres = stack.enter_context(
                EmbeddedPostgres(root / "postgres", settings=self._postgres_settings)
            )
            self._redis = stack.enter_context(EmbeddedRedis(root / "redis"))
            self._exit_stack = stack.pop_all()

    def stop(self) -> None:
        """Stop every part in reverse start order, then remove a temporary workdir. Idempotent."""
        exit_stack, self._exit_stack = self._exit_stack, None
        if exit_stack is not None:
            exit_stack.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


_T = TypeVar("_T")


def _started(part: _T | None, name: str) -> _T:
    if part is None:
        raise RuntimeError(f"EmbeddedStack.{name}: call start() first")
    return part
