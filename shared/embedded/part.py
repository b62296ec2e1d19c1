"""Common lifecycle for one embedded server process: start, readiness, stop, kill, context manager.

Contracts:
- ``start()`` returns only once the server answered a real request; on any failure it stops whatever it
  started and re-raises, so no process outlives a failed start.
- ``stop()`` and ``kill()`` are idempotent and leave no member of the child's process group behind, also
  when the server itself already died and left its children (vLLM's engine core and workers).
- ``stop()`` may be called from another thread while ``start()`` runs (a start can block for minutes):
  that start then fails with ``StartupError`` once the process has exited, and leaves nothing running.
- The TCP port is chosen on the first ``start()`` and kept, so a restart after ``kill()`` (fault tests)
  comes back at the same address and clients' connection strings stay valid.
- ``freeze()`` stops the whole process group in place (SIGSTOP) and ``thaw()`` resumes it (SIGCONT): a
  server that hangs and recovers with its state, for fault tests. ``stop()`` thaws a frozen server first,
  so its clean shutdown runs.
- No ``atexit`` hooks: the owner stops the part, typically with ``with Part(workdir) as part:``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from warmplane.shared.embedded.processes import (
    PROC,
    StartupError,
    free_port,
    kill_process_group,
    stop_process_group,
    wait_until,
)


class EmbeddedPart(ABC):
    """Base for the embedded servers; subclasses supply ``_spawn`` and ``_wait_ready``."""

    #: Short name, used for the log file and in error messages.
    name: ClassVar[str]
    #: Signal asking the server for a clean shutdown, and whether it goes to the whole group.
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM
    stop_whole_group: ClassVar[bool] = True

    def __init__(
        self,
        workdir: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
        wrapper: Sequence[str] = (),
    ) -> None:
        """`wrapper` is a command the server runs under (`ip netns exec NAME`: a network namespace of the
        caller's, where `host` is one of its addresses and `port` must be given)."""
        self.workdir = Path(workdir).absolute()
        self.wrapper = tuple(wrapper)
        self.host = host
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._port = port
        self._proc: subprocess.Popen[bytes] | None = None
        # Guards `_proc` and `_stop_requested` between a starting thread and a stopping one.
        self._lock = threading.Lock()
        self._stop_requested = False
        self._frozen = False
        #: Wall-clock seconds the last successful ``start()`` took, for start-up budgets.
        self.last_start_s: float | None = None

    @property
    def port(self) -> int:
        """TCP port the server listens on; fixed by the first ``start()`` unless given."""
        if self._port is None:
            raise RuntimeError(f"{self.name}: no port yet, call start() first")
        return self._port

    @property
    def log_path(self) -> Path:
        """File receiving the server's stdout and stderr (appended across restarts)."""
        return self.workdir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        """Pid (and process-group id) of the running server, None when not running."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the server process started by this object is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the server and block until it serves requests, at most ``start_timeout_s``."""
        with self._lock:
            if self._proc is not None:
                raise RuntimeError(f"{self.name}: already started (pid {self._proc.pid})")
            self._stop_requested = False
        began = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._port is None:
            self._port = free_port(self.host)
        deadline = began + self.start_timeout_s
        try:
            proc = self._spawn(deadline)
            with self._lock:
                stopped, self._proc = self._stop_requested, proc
            if stopped:
                raise StartupError(f"{self.name}: stopped while starting")
            self._wait_ready(proc, deadline)  # fails at once if a stop ends the process meanwhile
        except BaseException:
            self.kill()
            raise
        self.last_start_s = time.monotonic() - began

    def freeze(self, timeout_s: float = 5.0) -> None:
        """SIGSTOP the server's whole process group; return once every thread of it has stopped.

        A frozen server keeps its memory, data and sockets, but reads and answers nothing (the kernel still
        completes TCP handshakes into its listen backlog): its clients' requests time out and their group
        sessions expire, as with a host that hangs, until ``thaw()`` resumes it where it stopped. Raises
        ``RuntimeError`` if the server is not running, ``StartupError`` if some member is not seen stopped
        within ``timeout_s`` (seen in ``/proc``; without it, this returns once the signal is sent).
        """
        with self._lock:
            proc = self._proc
        if proc is None or proc.poll() is not None:
            raise RuntimeError(f"{self.name}: not running, nothing to freeze")
        self._frozen = True
        os.killpg(proc.pid, signal.SIGSTOP)
        wait_until(
            lambda: _group_stopped(proc.pid),
            timeout_s=timeout_s,
            what=f"{self.name}'s process group {proc.pid} to stop",
            log_path=self.log_path,
        )

    def thaw(self) -> None:
        """SIGCONT the server's process group after ``freeze()``; it resumes at once. Idempotent: a no-op
        when it is not frozen or no longer runs."""
        with self._lock:
            proc = self._proc
        if self._frozen and proc is not None:
            _continue(proc)
        self._frozen = False

    def stop(self) -> None:
        """Shut the server down cleanly (thawed first if frozen), SIGKILLing its group after
        ``stop_timeout_s``. Idempotent."""
        proc = self._take_process()
        if proc is not None and self._frozen:
            _continue(proc)  # a stopped process would hold its SIGTERM until the SIGKILL
        self._frozen = False
        if proc is not None:
            stop_process_group(
                proc, self.stop_timeout_s, sig=self.stop_signal, whole_group=self.stop_whole_group
            )

    def kill(self) -> None:
        """SIGKILL the server's whole process group, simulating a crash. Idempotent."""
        proc = self._take_process()
        self._frozen = False  # SIGKILL ends stopped processes too
        if proc is not None:
            kill_process_group(proc)

    def _take_process(self) -> subprocess.Popen[bytes] | None:
        """The running process, now this caller's to end; a start under way will fail."""
        with self._lock:
            self._stop_requested = True
            proc, self._proc = self._proc, None
        return proc

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

    @abstractmethod
    def _spawn(self, deadline: float) -> subprocess.Popen[bytes]:
        """Prepare on-disk state if needed and launch the server process (not yet ready)."""

    @abstractmethod
    def _wait_ready(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        """Block until the server answers a real request or raise ``StartupError`` at ``deadline``."""

    def _remaining(self, deadline: float) -> float:
        return max(0.0, deadline - time.monotonic())


def _continue(proc: subprocess.Popen[bytes]) -> None:
    """SIGCONT the group `proc` leads, if it still exists."""
    with contextlib.suppress(ProcessLookupError):  # the group is gone: nothing to resume
        os.killpg(proc.pid, signal.SIGCONT)


def _group_stopped(pgid: int, proc: Path = PROC) -> bool:
    """Whether every thread of every live (non-zombie) process of group ``pgid`` is stopped (state ``T``
    in ``/proc/<pid>/task/<tid>/stat``). True without ``/proc``, where it cannot be seen."""
    if not proc.is_dir():
        return True
    for stat in proc.glob("[0-9]*/stat"):
        fields = _stat_fields(stat)  # after "pid (comm)": state ppid pgrp ...
        if len(fields) < 3 or fields[2] != str(pgid) or fields[0] == "Z":
            continue
        for task in (stat.parent / "task").glob("[0-9]*/stat"):
            state = _stat_fields(task)[:1]
            if state and state[0] != "T":
                return False
    return True


def _stat_fields(stat: Path) -> list[str]:
    """The fields of a ``/proc`` stat file after the command name; empty if it is gone or unreadable."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []
