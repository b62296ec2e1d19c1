"""The main job, `warmplane up`, end to end on a slice of the real trace, run as a new user runs it: the
command, in a copy of the repository with nothing beside it. Every part is started and stopped by the job
itself, a second replica is planned, warmed, verified and ready, and the summary a new user reads is printed.

The copy proves the project stands alone: its trace, its tiny model's build script and its migrations come
from inside it (package data), not from a folder next to the checkout. Only the vLLM virtualenv is shared
(`WARMPLANE_VLLM_VENV`): `make vllm` would build the same one from the copy's own requirements, in minutes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from warmplane.shared.embedded.vllm_engine import vllm_venv

RUN_TIMEOUT_S = 900


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
    env["WARMPLANE_VLLM_VENV"] = str(vllm_venv())
    return env


def test_the_main_job_runs_from_a_copy_with_nothing_beside_it(
    tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    clone = _copy_of_the_repository(pytestconfig.rootpath, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warmplane"]
    env = _env(clone)
    where = subprocess.run(
        [sys.executable, "-c", "import warmplane.shared.traces as t; print(t.trace_path())"],
        cwd=clone,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(clone), where  # the copy's code and data, not the checkout's

    run = subprocess.run(
        [sys.executable, "-m", "warmplane.services.cli.main", "up", "--limit", "2000"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,  # the exit code is asserted below, with the output that explains it
    )
    text = run.stdout
    assert run.returncode == 0, f"exit {run.returncode}\n{text}\n{run.stderr[-4000:]}"
    assert (clone / ".warmplane" / "models" / "tiny-llama").is_dir()  # built inside the copy

    assert "2,000 request events replayed and counted durably" in text
    assert "replica-0 is ready: nothing to warm" in text  # it started before any traffic was known
    summary = re.search(
        r"replica-1 ready [\d.]+ s after it was scheduled \([\d.]+ s after its engine answered\): "
        r"(\d+) prefixes planned, (\d+) verified held by a probe, ([\d,]+) tokens pre-filled, (\d+) failures",
        text,
    )
    assert summary is not None, text
    planned, verified, prefilled, failures = summary.groups()
    assert int(planned) > 0 and verified == planned and failures == "0"
    assert int(prefilled.replace(",", "")) > 0
    warmed = re.search(r"replica-1 \(warmed\): ([\d.]+)%", text)
    cold = re.search(r"replica-0 \(cold\): +([\d.]+)%", text)
    assert warmed is not None and cold is not None, text
    assert float(warmed.group(1)) > float(cold.group(1))
