"""The main job, `warmplane up --keep-running`, used as a new user uses it: the command, in a copy of the
repository with nothing beside it, then what it printed pasted into a terminal and a browser.

The job starts every part itself, replays the history (events, then real chat traffic through the
gateway), scales to a second replica that is planned, warmed, verified and ready, and proves it in time
to first token against a cold engine. Then, with it running: the printed `curl` is answered through the
gateway, the CLI with the printed environment lists both replicas ready, the status page in headless
Chromium shows them with the warmed one's verified prefixes, `warmplane scale --to 3` makes the stack
start a third, and SIGINT, as Ctrl-C sends it, stops everything it started.

The copy proves the project stands alone: its trace, its models' build scripts and its migrations come
from inside it (package data), not from a folder next to the checkout. Only the vLLM virtualenv is shared
(`WARMPLANE_VLLM_VENV`), and the built models are linked in: `make vllm` would build the same ones from the
copy's own files, in minutes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.chromium import SCREENSHOTS, chromium
from tests.integration.up_job import UpJob, alive

RUN_TIMEOUT_S = 1500
STOP_DEADLINE_S = 45
MODEL = "smollm2"
STATUS_VERIFIED_COLUMN = 7
"""The status page's replica table: replica, model, node, state, since, plan, items done, verified, ..."""


def _copy_of_the_repository(root: Path, into: Path) -> Path:
    """The files git knows or would add (tracked, and untracked but not ignored), links kept as links."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout.decode()
    clone = into / "warmplane"
    for name in filter(None, listed.split("\0")):
        source = root / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the work tree, not yet in the index
        target = clone / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    return clone


def _env(clone: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMPLANE_")}
    env["PYTHONPATH"] = str(clone / "src")
    return env


@pytest.fixture
def clone(tmp_path: Path, pytestconfig: pytest.Config) -> Path:
    clone = _copy_of_the_repository(pytestconfig.rootpath, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warmplane"]
    models = clone / ".warmplane" / "models"
    models.parent.mkdir(parents=True)
    models.symlink_to(pytestconfig.rootpath / ".warmplane" / "models", target_is_directory=True)
    return clone


@pytest.fixture
def job(clone: Path, tmp_path: Path) -> Iterator[UpJob]:
    job = UpJob(clone, tmp_path / "stderr.txt", ["--limit", "2000", "--keep-running"], _env(clone))
    try:
        yield job
    finally:
        job.stop()


def _cli(env: dict[str, str], clone: Path, *args: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "warmplane.services.cli.main", *args],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, f"warmplane {' '.join(args)}: exit {run.returncode}\n{run.stdout}{run.stderr}"
    return run.stdout


def test_the_main_job_runs_from_a_copy_and_leaves_the_whole_product_up_until_ctrl_c(
    clone: Path, job: UpJob
) -> None:
    where = subprocess.run(
        [sys.executable, "-c", "import warmplane.shared.traces as t; print(t.trace_path())"],
        cwd=clone,
        env=_env(clone),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(clone), where  # the copy's code and data, not the checkout's

    job.wait_for("running; Ctrl-C stops everything", RUN_TIMEOUT_S)
    text = job.output()
    assert "replica-0 is ready: nothing to warm" in text  # it started before any traffic was known
    live = re.search(r"(\d+) sent in 60 s, (\d+) answered by replica-0: TTFT p50 (\d+) ms", text)
    assert live is not None, text
    assert int(live.group(2)) > 0 and live.group(1) == live.group(2), text
    summary = re.search(
        r"replica-1 ready [\d.]+ s after it was scheduled \([\d.]+ s after its engine answered\): "
        r"(\d+) prefixes planned, (\d+) verified held by a probe, ([\d,]+) tokens pre-filled, (\d+) failures",
        text,
    )
    assert summary is not None, text
    planned, verified, prefilled, failures = summary.groups()
    assert int(planned) > 0 and verified == planned and failures == "0", text
    assert int(prefilled.replace(",", "")) > 0
    warmed = re.search(r"replica-1 \(warmed\) +(\d+) ms +(\d+) ms +([\d.]+)%", text)
    cold = re.search(r"cold engine +(\d+) ms +(\d+) ms +([\d.]+)%", text)
    assert warmed is not None and cold is not None, text
    # Both engines get the same requests in the same order, so the warmed one's cache holds all the cold
    # one's does and its warm set besides: it serves at least as much. Whether it serves more depends on
    # whether the tail continues what the plan chose (the closing note of issue 23 has a run's figures);
    # a timed comparison is a benchmark's, not a test's.
    assert float(warmed.group(3)) >= float(cold.group(3)), text

    # What it printed, pasted: a request through the gateway.
    curl = job.wait_for(r"curl -s (http://\S+)/v1/chat/completions -H 'Authorization: Bearer (\S+)'", 1)
    gateway, key = curl.groups()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8}
    answer = httpx.post(
        f"{gateway}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
    assert answer.headers["x-warmplane-replica"] in {"replica-0", "replica-1"}

    # The CLI, with the environment it printed.
    exported = job.wait_for(r"export (WARMPLANE_API_URL=\S+ WARMPLANE_API_TOKEN=\S+)", 1).group(1)
    env = _env(clone) | dict(pair.split("=", 1) for pair in shlex.split(exported))
    replicas = {r["replica"]: r for r in json.loads(_cli(env, clone, "replicas", "--json"))}
    assert {name: r["state"] for name, r in replicas.items()} == {"replica-0": "ready", "replica-1": "ready"}

    # The status page, with its token, in a browser.
    page = job.wait_for(r"the status page: (http://\S+)", 1).group(1)
    dom = asyncio.run(chromium("--dump-dom", page)).decode()
    assert 'data-loaded="true"' in dom, dom[-3000:]
    for name in ("replica-0", "replica-1"):
        row = dom[dom.index(f"<td>{name}</td>") :].split("</tr>", 1)[0]
        assert '<span class="state ready">ready</span>' in row, row
    row = dom[dom.index("<td>replica-1</td>") :].split("</tr>", 1)[0]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    assert int(cells[STATUS_VERIFIED_COLUMN]) > 0, row  # the warmed one's verified prefixes
    shot = SCREENSHOTS / "make-up-status.png"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot.unlink(missing_ok=True)
    asyncio.run(chromium(f"--screenshot={shot}", page))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A scale-up a person asks for: the stack starts a third replica.
    _cli(env, clone, "scale", "--model", MODEL, "--to", "3")
    job.wait_for("replica-2 scheduled by a fleet.scaled", 60)

    # Ctrl-C, while replica-2's engine starts: everything stops.
    started = job.look()
    job.proc.send_signal(signal.SIGINT)
    assert job.exits_within(STOP_DEADLINE_S) == 128 + signal.SIGINT, job.output()
    assert alive(started) == [], job.output()
