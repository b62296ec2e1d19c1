"""Model folders are built once, atomically: a failed build leaves nothing, a stale one is replaced."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from warmplane.shared.embedded import model_folder, smollm2_model


def _writer(calls: list[Path], content: str = "weights") -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        calls.append(folder)
        (folder / "model.safetensors").write_text(content)

    return write


def test_a_built_folder_is_reused(tmp_path: Path) -> None:
    calls: list[Path] = []
    out = tmp_path / "models" / "m"
    assert model_folder.build_atomically(out, "m-v1", _writer(calls)) == out
    assert model_folder.build_atomically(out, "m-v1", _writer(calls)) == out
    assert len(calls) == 1
    assert calls[0].parent == out.parent  # built beside the target, so the rename is atomic
    assert model_folder.is_built(out, "m-v1")
    assert (out / "model.safetensors").read_text() == "weights"


def test_a_stale_folder_is_rebuilt_under_the_new_id(tmp_path: Path) -> None:
    out = tmp_path / "m"
    model_folder.build_atomically(out, "m-v1", _writer([], "old"))
    model_folder.build_atomically(out, "m-v2", _writer([], "new"))
    assert (out / "model.safetensors").read_text() == "new"
    assert model_folder.is_built(out, "m-v2")
    assert not model_folder.is_built(out, "m-v1")


def test_a_failed_build_leaves_no_folder_behind(tmp_path: Path) -> None:
    def fail(folder: Path) -> None:
        (folder / "partial").write_text("half")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        model_folder.build_atomically(tmp_path / "m", "m-v1", fail)
    assert list(tmp_path.iterdir()) == []


def test_smollm2_names_make_vllm_when_its_wheel_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2_model, "DISTRIBUTION", "warmplane-no-such-wheel")
    with pytest.raises(smollm2_model.GgufMissing, match="make vllm"):
        smollm2_model.gguf_path()
