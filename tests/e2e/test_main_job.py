"""The main job, `warmplane up --keep-running`, used as a new user uses it: the command, in a copy of the
repository with nothing beside it, then what it printed pasted into a terminal and a browser.

The job starts every part itself, replays the history (events, then real chat traffic through the
gateway), scales to a second replica that is planned, warmed, verified and ready, and proves it in time
to first token against a cold engine. Then, with it running: the printed `curl` is answered through the
gateway, the CLI with the printed environment lists both replicas ready, the status page in headless
Chromium shows them with the warmed one's verified prefixes, `warmplane scale --to 3` makes the stack
start a third, and SIGINT, as Ctrl-C sends it, stops everything it started.

The job runs with distinctive credentials pinned (`--credentials`) and every service logging (`--verbose`):
no secret may appear in any log line, in any file the parts wrote, or in any HTTP answer of the gateway, the
API or the warmer; the API key and the admin token appear only where the job prints them for the user to
paste (issue 21).

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
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.up_job import UpJob, alive
from tests.integration.chromium import SCREENSHOTS, chromium

RUN_TIMEOUT_S = 1500
STOP_DEADLINE_S = 45
MODEL = "smollm2"
STATUS_VERIFIED_COLUMN = 7
CREDENTIALS = ("admin_token", "api_key", "tenant_secret", "event_key")
PRINTED = ("  curl -s ", "the status page: ", "  export WARMPLANE_API_URL=")
"""The lines that show the user the API key and the admin token, and the only ones that may."""
API_READS = (
    "/status",
    "/openapi.json",
    "/healthz",
    "/readyz",
    "/v1/models",
    "/v1/replicas",
    "/v1/replicas/replica-1",
    "/v1/plans",
    "/v1/epochs",
    f"/v1/epochs/history?tenant=demo&model={MODEL}",
    f"/v1/misses/top?model={MODEL}",
    f"/v1/traffic?model={MODEL}",
    f"/v1/warm-sets?model={MODEL}",
)
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
def secrets() -> dict[str, str]:
    """Credentials no generator would produce, each findable anywhere it leaks to."""
    return {name: f"canary-{name}-{uuid.uuid4().hex}" for name in CREDENTIALS}


@pytest.fixture
def job(clone: Path, tmp_path: Path, secrets: dict[str, str]) -> Iterator[UpJob]:
    credentials = tmp_path / "credentials.json"
    credentials.write_text(json.dumps(secrets))
    args = ["--limit", "2000", "--keep-running", "--verbose", "--credentials", str(credentials)]
    job = UpJob(clone, tmp_path / "stderr.txt", [*args, "--workdir", str(tmp_path / "work")], _env(clone))
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


def _answers(gateway: str, key: str, api: str, token: str, *, metrics: str, warmer: str) -> list[str]:
    """The bodies and headers of every read endpoint of the gateway, the API (with the admin token, and
    refused without it) and the warmer."""
    bearer = {"Authorization": f"Bearer {token}"}
    gets = [
        (f"{gateway}/v1/models", {"Authorization": f"Bearer {key}"}),
        (f"{gateway}/v1/models", {"Authorization": "Bearer not-a-key-0123456789"}),
        (f"{gateway}/healthz", {}),
        (f"{metrics}/metrics", {}),
        *((f"{api}{path}", bearer) for path in API_READS),
        (f"{api}/v1/replicas", {"Authorization": "Bearer not-a-token-0123456789"}),
        *((f"{warmer}{path}", {}) for path in ("/status", "/metrics", "/ready")),
    ]
    with httpx.Client(timeout=30) as http:
        plans = http.get(f"{api}/v1/plans", headers=bearer).json()
        assert plans, "the job issued plans"
        gets.append((f"{api}/v1/plans/{plans[0]['plan_id']}", bearer))
        answers = []
        for url, headers in gets:
            answer = http.get(url, headers=headers)
            assert answer.status_code < 500, (url, answer.status_code)
            answers += [answer.text, str(answer.headers)]
    return answers


def test_the_main_job_runs_from_a_copy_and_leaves_the_whole_product_up_until_ctrl_c(
    clone: Path, job: UpJob, secrets: dict[str, str], tmp_path: Path
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
    exported = job.wait_for(r"export (WARMPLANE_API_URL=\S+ WARMPLANE_CLI_TOKEN=\S+)", 1).group(1)
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

    # Every HTTP answer a user or a scraper can get, the CLI's too, read for secrets after the job ends.
    answers = [answer.text, str(answer.headers), dom, json.dumps(replicas)]
    metrics = job.wait_for(r"the gateway's metrics \(Prometheus\): (http://\S+)", 1).group(1)
    warmer = job.wait_for(r"warmer status at (http://\S+)/status", 1).group(1)
    answers += _answers(
        gateway, key, env["WARMPLANE_API_URL"], env["WARMPLANE_CLI_TOKEN"], metrics=metrics, warmer=warmer
    )

    # A scale-up a person asks for: the stack starts a third replica.
    _cli(env, clone, "scale", "--model", MODEL, "--to", "3")
    job.wait_for("replica-2 scheduled by a fleet.scaled", 60)

    # Ctrl-C, while replica-2's engine starts: everything stops.
    started = job.look()
    job.proc.send_signal(signal.SIGINT)
    assert job.exits_within(STOP_DEADLINE_S) == 128 + signal.SIGINT, job.output()
    assert alive(started) == [], job.output()

    # No secret anywhere but where the job shows it to its user.
    shown = [line for line in job.stdout().splitlines() if line.startswith(PRINTED)]
    assert len(shown) == 3 and secrets["api_key"] in shown[0], shown
    assert all(secrets["admin_token"] in line for line in shown[1:]), shown
    logs = (tmp_path / "stderr.txt").read_text(errors="replace")
    assert "INFO" in logs, "the services logged (--verbose)"
    rest = [line for line in job.stdout().splitlines() if not line.startswith(PRINTED)]
    written = {path: path.read_bytes() for path in (tmp_path / "work").rglob("*") if path.is_file()}
    assert any(path.suffix == ".log" for path in written), sorted(written)[:20]
    for name, secret in secrets.items():
        assert secret not in logs, f"{name} in a log line"
        assert not [line for line in rest if secret in line], f"{name} printed where it is not shown"
        assert not [path for path, data in written.items() if secret.encode() in data], f"{name} in a file"
        assert not [text for text in answers if secret in text], f"{name} in an HTTP answer"
