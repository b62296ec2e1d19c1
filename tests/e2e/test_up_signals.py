"""`warmplane up` stops everything it started on the first SIGTERM or SIGINT, as a user stops it.

The job runs as a process (the command, from the project root, with the shared vLLM virtualenv). Every
process it started is read from /proc just before the signal: the job's descendants, vLLM's engine core
and workers and Postgres's backends included. After the signal the job must exit within
`STOP_DEADLINE_S` with 128 + the signal's number, and none of those processes may be left running.

- SIGTERM while it sends its live minute, after replica-0's API server was killed by hand (issue 23: its
  engine core and worker outlive it, and faststream's handlers, installed by the in-process planner,
  took the signals and the job waited forever). The stop is the same at any stage once the planner runs;
  `test_main_job` stops a job that keeps running, with SIGINT.
- SIGINT while it is still starting its first engine (the start blocks a thread), then SIGINT again
  while it stops: the second must not cut the stop short.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.up_job import UpJob, alive, cmdline, descendants, poll

LIMIT = 20
"""The history's requests: a few, for a short run; the engines' starts take most of it."""
RUNNING_TIMEOUT_S = 1200
STOP_DEADLINE_S = 45
"""Each part's stop is bounded (vLLM's 15 s, then SIGKILL). Seen on a loaded 2-core machine: 10 s
running, 21 s while an engine starts (vLLM's server then ignores SIGTERM until it is killed)."""
VLLM_SERVER = "vllm.entrypoints.openai.api_server"


@pytest.fixture
def job(pytestconfig: pytest.Config, tmp_path: Path) -> Iterator[UpJob]:
    """The job, started from the project root (its models are there); whatever it leaves is killed."""
    job = UpJob(pytestconfig.rootpath, tmp_path / "stderr.txt", ["--limit", str(LIMIT), "--keep-running"])
    try:
        yield job
    finally:
        job.stop()


def test_sigterm_while_busy_stops_everything_even_after_an_engine_died(job: UpJob) -> None:
    job.wait_for("goes through the gateway to replica-0", RUNNING_TIMEOUT_S)
    started = job.look()
    [killed] = [pid for pid in started if VLLM_SERVER in cmdline(pid)]
    its_engine_core = {
        pid: seen for pid, seen in started.items() if seen[0] == killed and "EngineCore" in cmdline(pid)
    }
    assert len(its_engine_core) == 1, job.output()

    os.kill(killed, signal.SIGKILL)  # the engine's API server, killed by hand
    poll(lambda: alive({killed: started[killed]}) == [], 30, "the engine's server to die", job)
    assert alive(its_engine_core), "the scenario needs an engine core outliving its API server"

    job.proc.send_signal(signal.SIGTERM)
    code = job.exits_within(STOP_DEADLINE_S)
    assert code == 128 + signal.SIGTERM, job.output()
    assert alive(started) == [], job.output()
    assert job.printed("SIGTERM: stopping everything"), job.output()


def test_sigint_twice_while_starting_stops_everything(job: UpJob) -> None:
    def engine_core_started() -> bool:
        return any("EngineCore" in cmdline(pid) for pid in descendants(job.proc.pid))

    poll(engine_core_started, RUNNING_TIMEOUT_S, "replica-0's engine core to start", job)
    assert job.printed("replica-0: starting"), job.output()
    assert not job.printed("replica-0 is ready"), "too late: the signal must come while it starts"
    started = job.look()

    job.proc.send_signal(signal.SIGINT)
    job.wait_for("SIGINT: stopping everything", 10)
    job.proc.send_signal(signal.SIGINT)
    code = job.exits_within(STOP_DEADLINE_S)
    assert code == 128 + signal.SIGINT, job.output()
    assert alive(started) == [], job.output()
    assert job.printed("SIGINT again: still stopping"), job.output()
