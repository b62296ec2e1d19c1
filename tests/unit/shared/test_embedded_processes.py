"""Telling a live process group from one that only left zombies behind (a container whose first process
does not reap orphans keeps them forever)."""

from __future__ import annotations

from pathlib import Path

from warmplane.shared.embedded.processes import live_members


def _stat(proc: Path, pid: int, state: str, pgrp: int, comm: str = "python") -> None:
    (proc / str(pid)).mkdir()
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {state} 1 {pgrp} {pgrp} 0 -1 4194560 0 0\n")


def test_a_group_with_a_running_member_is_live(tmp_path: Path) -> None:
    _stat(tmp_path, 10, "Z", 10)
    _stat(tmp_path, 11, "S", 10, comm="VLLM::EngineCore")
    assert live_members(10, tmp_path)


def test_a_group_of_zombies_is_not(tmp_path: Path) -> None:
    _stat(tmp_path, 10, "Z", 10)
    _stat(tmp_path, 11, "Z", 10, comm="a) tricky (name")  # comm may hold spaces and parentheses
    _stat(tmp_path, 12, "R", 99)
    (tmp_path / "self").mkdir()
    assert not live_members(10, tmp_path)
