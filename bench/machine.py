"""The machine and checkout a report's benches run on: CPU model, cores, memory, load, Python, git commit.
Reads /proc (Linux; elsewhere what `platform` says) and asks git; nothing here fails a report: what
cannot be read is said to be unknown.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path

from bench.report_document import Machine

_GIT_TIMEOUT_S = 10.0


def this_machine() -> Machine:
    return Machine(
        cpu=_cpu_model(),
        cores=os.cpu_count() or 0,
        memory_gib=_memory_gib(),
        python=platform.python_version(),
        system=f"{platform.system()} {platform.release()} {platform.machine()}",
    )


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages, rounded to hundredths."""
    return [round(value, 2) for value in os.getloadavg()]


def git_commit(ignored: Sequence[Path] = ()) -> str:
    """HEAD's short hash, with `+ uncommitted changes` when tracked files differ from it (`ignored`,
    the report's own output, left out); `unknown` outside a git checkout."""
    head = _git("rev-parse", "--short=12", "HEAD")
    if head is None:
        return "unknown (not a git checkout)"
    changed = _git(
        "status", "--porcelain", "--untracked-files=no", "--", ".", *(f":(exclude){path}" for path in ignored)
    )
    return head if not changed else f"{head} + uncommitted changes"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=_GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0.0
