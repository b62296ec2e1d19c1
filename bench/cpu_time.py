"""CPU time of processes, read from Linux's /proc: what a part costs, whichever of its processes did the
work. The benches that weigh the parts against each other read it here."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command's name (state first), or None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds `pid` has used (all its threads); (0, 0) once it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def tree_cpu_seconds(root: int | None) -> float:
    """CPU seconds used so far by process `root`, its live descendants and its reaped children: what a
    part such as Postgres costs, whichever of its processes did the work."""
    if root is None:
        return 0.0
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stats[int(entry.name)] = entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        if (stat := stats.get(pid)) is not None:
            total += sum(int(f) for f in stat[11:15])  # utime, stime, cutime, cstime
            pending.extend(children.get(pid, []))
    return total / os.sysconf("SC_CLK_TCK")
