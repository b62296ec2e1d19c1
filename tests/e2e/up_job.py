"""`warmplane up` run as a person runs it, a process, and what it started, read from /proc.

`UpJob` starts the command and reads its output as it comes; `descendants` lists every process it
started (vLLM's engine cores and workers and Postgres's backends included), and `alive` says which of
them still run, so a test can check that a stop left nothing behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from warmplane.shared.embedded.vllm_engine import vllm_venv

Processes = dict[int, tuple[int, str]]
"""pid -> (parent pid, start time): the start time (field 22 of /proc/<pid>/stat) tells a pid reused
meanwhile by another process."""


def stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after its command's name (state first), or None if gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(root: int) -> Processes:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = stat(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: Processes = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        fields = stat(pid)
        if fields is not None:
            found[pid] = (int(fields[1]), fields[19])
            todo += children.get(pid, [])
    return found


def alive(processes: Processes) -> list[str]:
    """Those still running (a zombie holds nothing but its pid), with their command lines."""
    running = []
    for pid, (_, started) in processes.items():
        fields = stat(pid)
        if fields is not None and fields[19] == started and fields[0] != "Z":
            running.append(f"{pid} {cmdline(pid)[:160]}")
    return running


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def http_status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return None


def poll(condition: Callable[[], bool], timeout_s: float, what: str, job: UpJob) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if job.proc.poll() is not None:
            raise AssertionError(f"the job exited ({job.proc.returncode}) waiting for {what}\n{job.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{job.output()}")
        time.sleep(0.1)


class UpJob:
    """`warmplane up` as a process; its stdout read as it comes, stderr to a file."""

    def __init__(
        self, root: Path, stderr: Path, args: Sequence[str], env: dict[str, str] | None = None
    ) -> None:
        """`warmplane up ARGS` in `root`, with `env` (default: this one's without `WARMPLANE_*`) and the
        shared vLLM virtualenv."""
        if env is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("WARMPLANE_")}
        env = env | {"WARMPLANE_VLLM_VENV": str(vllm_venv()), "PYTHONUNBUFFERED": "1"}
        self._stderr = stderr
        with stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "warmplane.services.cli.main", "up", *args],
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
        self.started = descendants(self.proc.pid)
        return self.started

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.append(line)

    def printed(self, pattern: str) -> re.Match[str] | None:
        return next((m for line in list(self._lines) if (m := re.search(pattern, line))), None)

    def stdout(self) -> str:
        return "".join(self._lines)

    def output(self) -> str:
        return "".join(self._lines) + "--- stderr ---\n" + self._stderr.read_text(errors="replace")[-4000:]

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        poll(lambda: self.printed(pattern) is not None, timeout_s, repr(pattern), self)
        found = self.printed(pattern)
        assert found is not None
        return found

    def stop(self) -> None:
        """Kill the job and whatever it left running (a test's clean-up, whatever the test did)."""
        left = self.started
        if self.proc.poll() is None:
            left = left | descendants(self.proc.pid)
            self.proc.kill()
            self.proc.wait()
        for line in alive(left):
            os.kill(int(line.split()[0]), signal.SIGKILL)

    def exits_within(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {timeout_s} s after the signal\n{self.output()}") from None
