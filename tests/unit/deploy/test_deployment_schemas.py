"""The deployment files against their formats' schemas, offline: the Kubernetes manifests (the production
overlay as kustomize renders it, and the Secrets' example) against the API's OpenAPI schemas (strict: an
unknown field fails) for every Kubernetes version from `OLDEST_KUBERNETES` to the newest that
`kubernetes-validate` ships, and docker-compose.yml against the Compose Specification's JSON schema (vendored
by `check-jsonschema`). Then what no schema sees: selectors that match their pods, probes and Services naming
ports that exist, references to ConfigMaps and Secrets that exist, health checks on what others wait for,
and commands the image's CLI knows. The Prometheus Operator's PodMonitors have no schema here:
`test_k8s_overlay.py` checks the fields they use."""

from __future__ import annotations

import contextlib
import importlib.resources
import io
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions

from tests.unit.deploy.k8s_manifests import IMAGE, containers, objects, pod_specs
from warmplane.services.cli.main import main as cli_main

ROOT = Path(__file__).resolve().parents[3]
OLDEST_KUBERNETES = (1, 30)
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "PodMonitor")}

Object = dict[str, Any]


def _kubernetes_versions() -> list[str]:
    """Every version whose schemas the package ships, from the oldest the manifests claim to support."""
    versions = sorted({tuple(map(int, v.split("."))) for v in all_versions()})
    return [".".join(map(str, v)) for v in versions if v[:2] >= OLDEST_KUBERNETES]


def _core_objects() -> list[tuple[str, Object]]:
    """The objects of the Kubernetes API itself (a custom resource has no schema in the package)."""
    return [(f, o) for f, o in objects() if (o["apiVersion"], o["kind"]) not in CUSTOM_KINDS]


def _compose() -> Object:
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(document, dict)
    return document


def test_the_schemas_cover_the_supported_kubernetes_versions() -> None:
    assert _kubernetes_versions()[0] == "{}.{}.0".format(*OLDEST_KUBERNETES)
    assert tuple(map(int, _kubernetes_versions()[-1].split("."))) >= (1, 37, 0)


@pytest.mark.parametrize("version", _kubernetes_versions())
def test_every_manifest_is_valid_for_the_kubernetes_api(version: str) -> None:
    assert _core_objects(), "no manifests found"
    for file, document in _core_objects():
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{file}: {document['kind']} {document['metadata']['name']} on {version}: {error}")


def test_the_kubernetes_schemas_catch_a_misspelt_field() -> None:
    planner = next(o for _, o in objects() if o["kind"] == "Deployment")
    container = planner["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(planner, _kubernetes_versions()[-1], strict=True)


def _compose_schema() -> Any:
    vendored = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(vendored.read_text())
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    return validator(schema, format_checker=validator.FORMAT_CHECKER)


def test_the_compose_file_follows_the_compose_specification() -> None:
    errors = [f"{e.json_path}: {e.message}" for e in _compose_schema().iter_errors(_compose())]
    assert not errors, "\n".join(errors)


def test_the_compose_schema_catches_a_misspelt_health_check() -> None:
    compose = _compose()
    compose["services"]["planner"]["helthcheck"] = compose["services"]["planner"].pop("healthcheck")
    assert any("helthcheck" in e.message for e in _compose_schema().iter_errors(compose))


def test_every_compose_service_is_checked_for_health_or_is_a_one_shot_job() -> None:
    """A service without a health check must be a one-shot that others wait on to complete (its exit
    status is its health) and is never restarted; every service waited on to be healthy has a check."""
    services = _compose()["services"]
    waited: dict[str, set[str]] = {}
    for service in services.values():
        for name, condition in service.get("depends_on", {}).items():
            assert name in services, f"depends on {name}, which compose does not define"
            waited.setdefault(name, set()).add(condition["condition"])
    for name, service in services.items():
        if "healthcheck" in service:
            assert service["healthcheck"]["test"][0] in {"CMD", "CMD-SHELL"}, name
            assert "disable" not in service["healthcheck"], name
        else:
            assert waited.get(name) == {"service_completed_successfully"}, f"{name} has no health check"
            assert service.get("restart", "no") == "no", f"{name}: a one-shot job must not restart"


def test_selectors_ports_and_references_in_the_manifests_resolve() -> None:
    names = {(o["kind"], o["metadata"]["name"]) for _, o in objects()}
    pods: list[tuple[dict[str, str], set[str]]] = []
    for workload, template in pod_specs():
        labels = template.get("metadata", {}).get("labels", {})
        if "selector" in workload["spec"]:
            selector = workload["spec"]["selector"]["matchLabels"]
            assert selector.items() <= labels.items(), f"{workload['metadata']['name']}: selector misses pods"
        ports: set[str] = set()
        for container in containers(template):
            named = {port["name"] for port in container.get("ports", []) if "name" in port}
            ports |= named
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = container.get(probe, {}).get("httpGet", {}).get("port")
                assert not isinstance(port, str) or port in named, f"{container['name']} {probe}: {port}"
            for source in container.get("envFrom", []):
                for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                    if key in source and not source[key].get("optional"):
                        assert (kind, source[key]["name"]) in names, f"{container['name']}: no {source[key]}"
        pods.append((labels, ports))
    for _, service in objects():
        if service["kind"] != "Service":
            continue
        selector = service["spec"]["selector"]
        matched = [ports for labels, ports in pods if selector.items() <= labels.items()]
        assert matched, f"Service {service['metadata']['name']} selects no pods"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort")
            assert not isinstance(target, str) or any(target in ports for ports in matched), target


def _commands() -> list[list[str]]:
    """The arguments each Warmplane container is started with, in the manifests and in compose."""
    found = [
        container["args"]
        for _, template in pod_specs()
        for container in containers(template)
        if container["image"].split(":")[0] == IMAGE
    ]
    found += [s["command"] for s in _compose()["services"].values() if s.get("build") == "."]
    return found


def test_every_warmplane_container_runs_a_command_the_cli_knows() -> None:
    commands = _commands()
    assert len(commands) >= 4
    for command in commands:
        with (
            pytest.raises(SystemExit) as exited,
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            cli_main([command[0], "--help"])
        assert exited.value.code == 0, f"the image's CLI has no command {command[0]!r}"
