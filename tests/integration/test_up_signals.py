"""`warmplane up` stops everything it started on the first SIGTERM or SIGINT, as a user stops it.

The job runs as a process (the command, from the project root, with the shared vLLM virtualenv). Every
process it started is read from /proc just before the signal: the job's descendants, vLLM's engine core
and workers and Postgres's backends included. After the signal the job must exit within
`STOP_DEADLINE_S` with 128 + the signal's number, and none of those processes may be left running.

- SIGTERM while it keeps running, after one engine's API server was killed by hand (issue 23: its
  engine core and worker outlive it, and faststream's handlers, installed by the in-process planner,
  took the signals and the job waited forever).
- SIGINT while it is still starting its first engine (the start blocks a thread), then SIGINT again
  while it stops: the second must not cut the stop short.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from warmplane.shared.embedded.vllm_engine import vllm_venv

LIMIT = 20
"""Requests replayed: a few, for a short run; the two engines' starts take most of it."""
RUNNING_TIMEOUT_S = 600
STOP_DEADLINE_S = 45
"""Each part's stop is bounded (vLLM's 15 s, then SIGKILL). Seen on a loaded 2-core machine: 10 s
running, 21 s while an engine starts (vLLM's server then ignores SIGTERM until it is killed)."""
VLLM_SERVER = "vllm.entrypoints.openai.api_server"

Processes = dict[int, tuple[int, str]]
"""pid -> (parent pid, start time): the start time (field 22 of /proc/<pid>/stat) tells a pid reused
meanwhile by another process."""


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after its command's name (state first), or None if gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _descendants(root: int) -> Processes:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: Processes = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        fields = _stat(pid)
        if fields is not None:
            found[pid] = (int(fields[1]), fields[19])
            todo += children.get(pid, [])
    return found


def _alive(processes: Processes) -> list[str]:
    """Those still running (a zombie holds nothing but its pid), with their command lines."""
    running = []
    for pid, (_, started) in processes.items():
        fields = _stat(pid)
        if fields is not None and fields[19] == started and fields[0] != "Z":
            running.append(f"{pid} {_cmdline(pid)[:160]}")
    return running


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return None


def _poll(condition: Callable[[], bool], timeout_s: float, what: str, job: _Job) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if job.proc.poll() is not None:
            raise AssertionError(f"the job exited ({job.proc.returncode}) waiting for {what}\n{job.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{job.output()}")
        time.sleep(0.1)


class _Job:
    """`warmplane up --keep-running` as a process; its stdout read as it comes, stderr to a file."""

    def __init__(self, root: Path, stderr: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WARMPLANE_")}
        env |= {"WARMPLANE_VLLM_VENV": str(vllm_venv()), "PYTHONUNBUFFERED": "1"}
        self._stderr = stderr
        argv = [sys.executable, "-m", "warmplane.services.cli.main", "up", "--limit", str(LIMIT)]
        with stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [*argv, "--keep-running"],
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        self._lines: list[str] = []
        self.started: Processes = {}
        """What the job had started when the test last looked (`look`)."""
        threading.Thread(target=self._read, daemon=True).start()

    def look(self) -> Processes:
        self.started = _descendants(self.proc.pid)
        return self.started

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.append(line)

    def printed(self, pattern: str) -> re.Match[str] | None:
        return next((m for line in list(self._lines) if (m := re.search(pattern, line))), None)

    def output(self) -> str:
        return "".join(self._lines) + "--- stderr ---\n" + self._stderr.read_text(errors="replace")[-4000:]

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        _poll(lambda: self.printed(pattern) is not None, timeout_s, repr(pattern), self)
        found = self.printed(pattern)
        assert found is not None
        return found

    def exits_within(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {timeout_s} s after the signal\n{self.output()}") from None


@pytest.fixture
def job(pytestconfig: pytest.Config, tmp_path: Path) -> Iterator[_Job]:
    """The job, started from the project root (its tiny model is there); whatever it leaves is killed."""
    job = _Job(pytestconfig.rootpath, tmp_path / "stderr.txt")
    try:
        yield job
    finally:
        left = job.started
        if job.proc.poll() is None:
            left = left | _descendants(job.proc.pid)
            job.proc.kill()
            job.proc.wait()
        for line in _alive(left):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def test_sigterm_while_running_stops_everything_even_after_an_engine_died(job: _Job) -> None:
    status = job.wait_for(r"warmer status at (http://\S+)/status", RUNNING_TIMEOUT_S)
    job.wait_for("Ctrl-C stops everything", 10)
    started = job.look()
    servers = [pid for pid in started if VLLM_SERVER in _cmdline(pid)]
    assert len(servers) == 2, job.output()
    killed = servers[0]
    its_engine_core = {
        pid: seen for pid, seen in started.items() if seen[0] == killed and "EngineCore" in _cmdline(pid)
    }
    assert len(its_engine_core) == 1, job.output()

    os.kill(killed, signal.SIGKILL)  # one engine's API server, killed by hand
    ready = status.group(1) + "/ready"
    _poll(lambda: _status(ready) == 503, 30, "the warmer to see it failed", job)
    assert _alive(its_engine_core), "the scenario needs an engine core outliving its API server"

    job.proc.send_signal(signal.SIGTERM)
    code = job.exits_within(STOP_DEADLINE_S)
    assert code == 128 + signal.SIGTERM, job.output()
    assert _alive(started) == [], job.output()
    assert job.printed("SIGTERM: stopping everything"), job.output()


def test_sigint_twice_while_starting_stops_everything(job: _Job) -> None:
    def engine_core_started() -> bool:
        return any("EngineCore" in _cmdline(pid) for pid in _descendants(job.proc.pid))

    _poll(engine_core_started, RUNNING_TIMEOUT_S, "replica-0's engine core to start", job)
    assert job.printed("replica-0: starting"), job.output()
    assert not job.printed("replica-0 is ready"), "too late: the signal must come while it starts"
    started = job.look()

    job.proc.send_signal(signal.SIGINT)
    job.wait_for("SIGINT: stopping everything", 10)
    job.proc.send_signal(signal.SIGINT)
    code = job.exits_within(STOP_DEADLINE_S)
    assert code == 128 + signal.SIGINT, job.output()
    assert _alive(started) == [], job.output()
    assert job.printed("SIGINT again: still stopping"), job.output()
