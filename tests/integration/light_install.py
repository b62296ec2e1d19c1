"""The light distribution built from this checkout and installed where vLLM runs: for the tests of the package
itself and of the middleware inside a vLLM server.

Installed into the vLLM environment as pip would, without changing it: pip's plan for installing the wheel
there (`--dry-run --report`) is carried out into a folder of its own, which a vLLM process then gets on its
`PYTHONPATH`. The shared `.venv-vllm` stays as `make vllm` built it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from warmplane.shared.embedded.vllm_engine import vllm_venv

PIP_TIMEOUT_S = 600
PIP = ("-m", "pip", "--disable-pip-version-check")


def run(argv: list[str], *, env: dict[str, str] | None = None) -> str:
    """Run `argv`; its stdout. Fails the test with its output on a non-zero exit."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=env, check=False)
    assert done.returncode == 0, f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def installed(python: str) -> dict[str, str]:
    """Distributions of the environment `python` runs in: normalised name -> version."""
    listed = json.loads(run([python, *PIP, "list", "--format", "json"]))
    return {_name(entry["name"]): entry["version"] for entry in listed}


def _name(name: str) -> str:
    return name.lower().replace("_", "-")


def build_wheel(root: Path, out: Path) -> Path:
    """The project's wheel, built from `root` into `out`."""
    run([sys.executable, *PIP, "wheel", "--quiet", "--no-deps", "-w", str(out), str(root)])
    [built] = out.glob("warmplane-*.whl")
    return built


@dataclass(frozen=True, slots=True)
class BesideVllm:
    python: str
    """The vLLM environment's interpreter."""
    before: dict[str, str]
    """What that environment holds."""
    planned: dict[str, str]
    """What pip would install there for the wheel: name -> version."""
    folder: Path
    """Where the plan was carried out: put it on that interpreter's `PYTHONPATH`."""


def install_beside_vllm(wheel: Path, folder: Path) -> BesideVllm:
    python = str(vllm_venv() / "bin" / "python")
    before = installed(python)
    report = folder.parent / f"{folder.name}-plan.json"
    run([python, *PIP, "install", "--quiet", "--dry-run", "--report", str(report), str(wheel)])
    plan = json.loads(report.read_text())["install"]
    planned = {_name(item["metadata"]["name"]): item["metadata"]["version"] for item in plan}
    pins = [f"{name}=={version}" for name, version in planned.items() if name != "warmplane"]
    run([python, *PIP, "install", "--quiet", "--no-deps", "--target", str(folder), str(wheel), *pins])
    return BesideVllm(python, before, planned, folder)
