"""`EmbeddedVllm`'s command line, built without starting anything (no socket, no engine)."""

from __future__ import annotations

from pathlib import Path

from warmplane.shared.embedded.vllm_engine import EmbeddedVllm


def _engine(tmp_path: Path, cpu_affinity: tuple[int, ...] = ()) -> EmbeddedVllm:
    venv, model = tmp_path / "venv", tmp_path / "model"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    model.mkdir()
    (model / "config.json").write_text("{}")
    return EmbeddedVllm(tmp_path / "work", model, venv=venv, port=8123, cpu_affinity=cpu_affinity)


def test_an_engine_confined_to_cores_runs_its_whole_server_under_taskset(tmp_path: Path) -> None:
    argv = _engine(tmp_path, cpu_affinity=(1, 3)).command()

    assert argv[:3] == ["taskset", "-c", "1,3"]
    assert argv[3].endswith("venv/bin/python") and argv[4:6] == ["-m", "vllm.entrypoints.openai.api_server"]


def test_an_engine_without_affinity_is_the_server_itself(tmp_path: Path) -> None:
    assert _engine(tmp_path).command()[0].endswith("venv/bin/python")
