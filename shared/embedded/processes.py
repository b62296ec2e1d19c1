"""Child-process plumbing shared by the embedded parts: spawn, wait, stop.

Contracts:
- Every child runs in its own session and process group (``start_new_session=True``), so stopping the
  group also stops whatever the child forked (Postgres backends and auxiliary processes).
- Every wait is bounded by an explicit deadline; a failed wait raises :class:`StartupError` naming what was
  awaited and quoting the tail of the child's log.
- :func:`stop_process_group` and :func:`kill_process_group` are idempotent: calling them on a process that
  already ended, or twice, is a no-op.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

#: How often conditions are re-checked; short so start-up latency is not padded.
POLL_INTERVAL_S = 0.01
_LOG_TAIL_BYTES = 4000

PROC = Path("/proc")
"""Where Linux lists processes; absent elsewhere, where a signal probe decides alone."""


class StartupError(RuntimeError):
    """A child did not become ready: it exited early or a readiness condition missed its deadline."""


def start_process(
    argv: Sequence[str],
    log_path: Path,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as the leader of a new process group, stdout and stderr appended to ``log_path``.

    ``user`` (root only) runs the child as that system user with its primary group and no
    supplementary groups. The log file is opened in append mode so restarts keep earlier output.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        # The child inherits its own copy of the descriptor; the parent's copy can close right away.
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            user=user,
            group=_primary_group(user),
            extra_groups=[] if user is not None else None,
        )


def run_to_completion(
    argv: Sequence[str],
    log_path: Path,
    *,
    timeout_s: float,
    what: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
) -> None:
    """Run a short-lived command like :func:`start_process` and wait for it to succeed.

    On a non-zero exit or after ``timeout_s`` the whole group is killed and :class:`StartupError`
    names ``what`` and quotes the log tail.
    """
    proc = start_process(argv, log_path, cwd=cwd, env=env, user=user)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise StartupError(
            f"timed out after {timeout_s:.1f}s waiting for {what}\n"
            f"--- log tail ({log_path}) ---\n{log_tail(log_path)}"
        ) from None
    finally:
        kill_process_group(proc)  # reap any helper the command left behind in its group
    if code != 0:
        raise StartupError(
            f"{what} failed with exit code {code}\n--- log tail ({log_path}) ---\n{log_tail(log_path)}"
        )


def _primary_group(user: str | None) -> int | None:
    if user is None:
        return None
    return pwd.getpwnam(user).pw_gid


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago.

    The port is released before returning, so another process may still take it first; callers
    see that as the child exiting early with an address-in-use message in its log.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_open(host: str, port: int, timeout_s: float = 0.2) -> bool:
    """Return True if a TCP connection to ``host:port`` succeeds right now."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def log_tail(log_path: Path | None, max_bytes: int = _LOG_TAIL_BYTES) -> str:
    """Return the last ``max_bytes`` of ``log_path`` as text, or a note when there is no log."""
    if log_path is None or not log_path.exists():
        return "(no log)"
    with log_path.open("rb") as log:
        log.seek(max(0, log_path.stat().st_size - max_bytes))
        return log.read().decode("utf-8", errors="replace")


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout_s: float,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
    log_path: Path | None = None,
) -> None:
    """Poll ``condition`` until it returns True, at most ``timeout_s`` seconds.

    Fails fast with :class:`StartupError` if ``proc`` exits meanwhile. The condition must itself
    return promptly (bounded by its own timeout); it is always tried at least once.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return
        if proc is not None and proc.poll() is not None:
            raise StartupError(
                f"process {proc.pid} exited with code {proc.returncode} while waiting for {what}\n"
                f"--- log tail ({log_path}) ---\n{log_tail(log_path)}"
            )
        if time.monotonic() >= deadline:
            raise StartupError(
                f"timed out after {timeout_s:.1f}s waiting for {what}\n"
                f"--- log tail ({log_path}) ---\n{log_tail(log_path)}"
            )
        time.sleep(POLL_INTERVAL_S)


def wait_for_port(
    host: str,
    port: int,
    timeout_s: float,
    what: str,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    log_path: Path | None = None,
) -> None:
    """Wait until ``host:port`` accepts TCP connections; see :func:`wait_until` for failure modes."""
    wait_until(
        lambda: port_is_open(host, port),
        timeout_s=timeout_s,
        what=f"{what} to listen on {host}:{port}",
        proc=proc,
        log_path=log_path,
    )


def stop_process_group(
    proc: subprocess.Popen[bytes],
    timeout_s: float,
    *,
    sig: signal.Signals = signal.SIGTERM,
    whole_group: bool = True,
) -> None:
    """Ask the process (group) to stop with ``sig``, wait up to ``timeout_s``, then SIGKILL the group.

    ``whole_group=False`` sends ``sig`` to the leader only, for servers such as Postgres whose leader
    shuts its children down in order. A leader that already died (crashed, or killed by hand) may have
    left members behind, which outlive it: vLLM's engine core and workers do. They get ``sig`` at once,
    as a group. Returns once the leader is reaped and the group is empty or has been killed. Idempotent.
    """
    pgid = proc.pid  # start_new_session makes the leader's pid the group id
    deadline = time.monotonic() + timeout_s
    if proc.poll() is None:
        _signal(proc.pid, pgid, sig, whole_group)
    elif _group_alive(pgid):
        _signal(proc.pid, pgid, sig, whole_group=True)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    _wait_group_empty(pgid, deadline)
    kill_process_group(proc)


def kill_process_group(proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> None:
    """SIGKILL the whole group and reap the leader. Idempotent.

    Raises :class:`StartupError` only in the pathological case that the group survives SIGKILL
    for ``timeout_s`` (e.g. a member stuck in uninterruptible I/O).
    """
    pgid = proc.pid
    _signal(proc.pid, pgid, signal.SIGKILL, whole_group=True)
    proc.wait(timeout=timeout_s)
    if not _wait_group_empty(pgid, time.monotonic() + timeout_s):
        raise StartupError(f"process group {pgid} still has members {timeout_s:.1f}s after SIGKILL")


def _signal(pid: int, pgid: int, sig: signal.Signals, whole_group: bool) -> None:
    try:
        if whole_group:
            os.killpg(pgid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass  # already gone: stopping twice is fine


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # members exist but run as another user we cannot signal
    return live_members(pgid) if PROC.is_dir() else True


def live_members(pgid: int, proc: Path | None = None) -> bool:
    """Whether a process of group ``pgid`` is running, zombies aside (from ``/proc/<pid>/stat``).

    A killed child whose parent died is a zombie until init reaps it, and in a container whose first
    process does not reap orphans it never is: it holds nothing but its pid, so it does not count.
    """
    for stat in (proc or PROC).glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        except (OSError, IndexError):
            continue  # gone meanwhile, or unreadable
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _wait_group_empty(pgid: int, deadline: float) -> bool:
    """Poll until no process is left in ``pgid`` or ``deadline`` passes; return whether it emptied."""
    while _group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL_S)
    return True
