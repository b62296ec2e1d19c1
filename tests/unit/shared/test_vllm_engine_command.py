"""`EmbeddedVllm`'s command line and environment, built without starting anything (no socket, no engine),
and its CPU priority, on a stand-in process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from warmplane.shared.embedded.vllm_engine import EmbeddedVllm, yield_cpu


def _engine(tmp_path: Path, cpu_affinity: tuple[int, ...] = (), workdir: Path | None = None) -> EmbeddedVllm:
    venv, model = tmp_path / "venv", tmp_path / "model"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "python").touch()
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return EmbeddedVllm(
        workdir or tmp_path / "work", model, venv=venv, port=8123, cpu_affinity=cpu_affinity, kv_events=True
    )


def test_an_engine_confined_to_cores_runs_its_whole_server_under_taskset(tmp_path: Path) -> None:
    argv = _engine(tmp_path, cpu_affinity=(1, 3)).command()

    assert argv[:3] == ["taskset", "-c", "1,3"]
    assert argv[3].endswith("venv/bin/python") and argv[4:6] == ["-m", "vllm.entrypoints.openai.api_server"]


def test_an_engine_without_affinity_is_the_server_itself(tmp_path: Path) -> None:
    assert _engine(tmp_path).command()[0].endswith("venv/bin/python")


def test_sockets_go_to_a_short_folder_when_the_workdir_leaves_no_room_for_their_names(tmp_path: Path) -> None:
    """A socket path is at most 107 bytes: vLLM's own (TMPDIR, a slash, a uuid) and the KV events'."""
    with tempfile.TemporaryDirectory(prefix="wp-") as folder:
        short = _engine(tmp_path, workdir=Path(folder) / "work")
        assert short.ipc_dir == Path(folder, "work").absolute()
        assert short.environment()["TMPDIR"] == str(short.ipc_dir / "tmp")
    deep = _engine(tmp_path, workdir=tmp_path / "a-folder-with-a-long-name" / "vllm-replica-0")
    other = _engine(tmp_path, workdir=tmp_path / "a-folder-with-a-long-name" / "vllm-replica-1")
    assert not deep.ipc_dir.is_relative_to(tmp_path) and deep.ipc_dir != other.ipc_dir
    sockets = [f"{deep.environment()['TMPDIR']}/{'u' * 36}", deep.kv_events_replay_endpoint]
    assert all(socket is not None and len(socket.removeprefix("ipc://")) <= 107 for socket in sockets)
    assert deep.environment()["VLLM_CACHE_ROOT"] == str(deep.scratch_dir), "caches stay in the workdir"
    (deep.ipc_dir / "tmp").mkdir(parents=True)
    deep.stop()
    assert not deep.ipc_dir.exists(), "removed at stop"


def test_an_engine_and_what_it_spawned_yield_the_cpu_to_everything_else() -> None:
    """`yield_cpu` reaches children already running (vLLM's engine core and workers) and the session's
    autogroup, where the kernel has them."""
    script = "import subprocess, time; subprocess.Popen(['sleep', '30']); time.sleep(30)"
    leader = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        children = Path(f"/proc/{leader.pid}/task/{leader.pid}/children")
        deadline = time.monotonic() + 10
        while not children.read_text().split() and time.monotonic() < deadline:
            time.sleep(0.01)  # the child is spawned by the leader: not a fixed wait, a bounded poll
        [child] = map(int, children.read_text().split())
        yield_cpu(leader.pid)
        assert os.getpriority(os.PRIO_PROCESS, leader.pid) == os.getpriority(os.PRIO_PROCESS, child) == 19
        autogroup = Path(f"/proc/{leader.pid}/autogroup")
        if autogroup.exists():  # kernels with sched_autogroup
            assert autogroup.read_text().split()[-1] == "19"
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
