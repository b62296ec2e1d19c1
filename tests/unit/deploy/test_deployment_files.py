"""The deployment files stay consistent with the code: compose services, health checks, settings."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from tests.unit.deploy.k8s_manifests import by_name, container
from warmplane.services.api.metrics import ApiMetrics
from warmplane.services.api.settings import ApiOptions, ApiSettings
from warmplane.services.gateway.metrics import GatewayMetrics
from warmplane.services.gateway.settings import GatewayOptions, GatewaySettings
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.settings import PlannerSettings
from warmplane.services.warmer.metrics import WarmerMetrics
from warmplane.services.warmer.settings import WarmerSettings
from warmplane.shared.settings import load_settings

_COMPOSE_DEFAULT = re.compile(r"\$\{[A-Z0-9_]+:-([^}]*)\}")

ROOT = Path(__file__).resolve().parents[3]
EVENT_KEYS = '["a-shared-event-key-of-32-characters-at-least"]'


def _compose() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(document, dict)
    return document


def test_every_long_running_service_has_a_health_check() -> None:
    services = _compose()["services"]
    expected = {"kafka", "postgres", "redis", "migrate", "planner", "vllm", "warmer", "gateway", "api"}
    assert expected <= set(services)
    for name, service in services.items():
        if name != "migrate":  # a one-shot job: its exit status is its health
            assert "healthcheck" in service, f"{name} has no health check"


def test_services_start_after_what_they_need() -> None:
    services = _compose()["services"]
    assert services["planner"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_the_compose_environment_is_valid_planner_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    environment = _compose()["services"]["planner"]["environment"]
    for key, value in environment.items():
        monkeypatch.setenv(key, str(value).replace("${WARMPLANE_POSTGRES_PASSWORD}", "secret"))
    monkeypatch.setenv("WARMPLANE_EVENT_KEYS", EVENT_KEYS)
    settings = load_settings(PlannerSettings)
    assert settings.kafka.bootstrap_servers == "kafka:9092"
    assert "secret" not in repr(settings)


def test_the_compose_warmer_is_valid_warmer_settings_for_its_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    services = _compose()["services"]
    filled = {
        "${WARMPLANE_POSTGRES_PASSWORD}": "secret",
        "${WARMPLANE_SERVED_MODEL:-qwen-2.5-7b}": "qwen-2.5-7b",
    }
    for key, raw in services["warmer"]["environment"].items():
        value = str(raw)
        for variable, given in filled.items():
            value = value.replace(variable, given)
        monkeypatch.setenv(key, '{"acme": "tenant-secret"}' if key == "WARMPLANE_TENANT_SECRETS" else value)
    monkeypatch.setenv("WARMPLANE_EVENT_KEYS", EVENT_KEYS)
    settings = load_settings(WarmerSettings)
    [engine] = settings.engines
    assert engine.url == "http://vllm:8000" and engine.block_size == 16
    assert "--block-size=16" in services["vllm"]["command"]
    assert f"--served-model-name={'${WARMPLANE_SERVED_MODEL:-qwen-2.5-7b}'}" in services["vllm"]["command"]
    events = _kv_events_config(services["vllm"]["command"])
    assert (events["endpoint"], events["replay_endpoint"]) == ("tcp://*:5557", "tcp://*:5558")
    assert (engine.kv_events_endpoint, engine.kv_events_replay_endpoint) == (
        "tcp://vllm:5557",
        "tcp://vllm:5558",
    )
    assert "tenant-secret" not in repr(settings)
    assert "/ready" in " ".join(services["warmer"]["healthcheck"]["test"])


def test_the_compose_gateway_is_valid_gateway_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    given = {
        "WARMPLANE_TENANT_KEYS": '{"acme": ["acme-key-0123456789"]}',
        "WARMPLANE_TENANT_SECRETS": '{"acme": "tenant-secret"}',
        "WARMPLANE_EVENT_KEYS": EVENT_KEYS,
    }
    for key, raw in _compose()["services"]["gateway"]["environment"].items():
        value = given.get(key, str(raw).replace("${WARMPLANE_POSTGRES_PASSWORD}", "secret"))
        monkeypatch.setenv(key, _COMPOSE_DEFAULT.sub(r"\1", value))  # Compose's `${NAME:-default}`
    settings = load_settings(GatewaySettings)
    assert settings.gateway.instance == "gateway-0" and settings.gateway.block_size == 16
    assert not settings.result_cache.enabled
    assert "key-1" not in repr(settings) and "tenant-secret" not in repr(settings)


def test_the_image_installs_what_the_package_links_with_the_services_dependencies() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-cache-dir '.[services]'" in dockerfile, "the light package alone runs no service"
    for linked in (ROOT / "src" / "warmplane").iterdir():
        if linked.is_symlink():
            assert f"COPY {linked.name} " in dockerfile, f"the image misses {linked.name}/"


def test_the_vllm_pod_is_ready_only_when_its_warmer_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = by_name()
    pod = objects[("StatefulSet", "vllm")]
    warmer = container(pod, "warmer")
    probe = warmer["readinessProbe"]["httpGet"]
    assert probe["path"] == "/ready" and probe["port"] == "warmer"
    assert {"name": "warmer", "containerPort": WarmerSettings.model_fields["http_port"].default} in warmer[
        "ports"
    ]
    assert "readinessProbe" not in container(pod, "vllm")  # the engine's own /health is not warmth
    config = objects[("ConfigMap", "warmplane")]["data"]
    secrets = objects[("Secret", "warmplane-tenant-secrets")]["stringData"]
    for key, value in {**config, **secrets}.items():
        monkeypatch.setenv(key, value)
    downward = {"metadata.name": "vllm-1", "status.podIP": "10.2.0.7", "spec.nodeName": "gpu-node-3"}
    declared: dict[str, str] = {}
    for variable in warmer["env"]:  # as the kubelet does: $(NAME) of a variable declared before it
        value = variable.get("value") or downward[variable["valueFrom"]["fieldRef"]["fieldPath"]]
        for name, known in declared.items():
            value = value.replace(f"$({name})", known)
        declared[variable["name"]] = value
        monkeypatch.setenv(variable["name"], value)
    settings = load_settings(WarmerSettings)
    [engine] = settings.engines
    # Each warmer is its own node (its pod), whatever else runs on the Kubernetes node; it announces
    # the address routers in other pods reach, not its loopback.
    assert (settings.node, engine.replica, engine.block_size) == ("vllm-1", "vllm-1", 16)
    assert (engine.url, engine.announced_url) == ("http://127.0.0.1:8000", "http://10.2.0.7:8000")
    assert f"--block-size={engine.block_size}" in container(pod, "vllm")["args"]
    assert f"--served-model-name={engine.served_model}" in container(pod, "vllm")["args"]
    # The engine publishes its KV events on sockets in a volume the warmer mounts too.
    events = _kv_events_config(container(pod, "vllm")["args"])
    assert (events["endpoint"], events["replay_endpoint"]) == (
        engine.kv_events_endpoint,
        engine.kv_events_replay_endpoint,
    )
    volume = {"name": "kv-events", "mountPath": "/run/warmplane"}
    assert all(volume in container(pod, name)["volumeMounts"] for name in ("vllm", "warmer"))
    assert str(engine.kv_events_endpoint).startswith("ipc:///run/warmplane/")


def test_a_leaving_vllm_pod_serves_until_its_warmer_has_drained_it() -> None:
    pod = by_name()[("StatefulSet", "vllm")]
    engine = container(pod, "vllm")
    assert "initialDelaySeconds" not in engine["livenessProbe"]  # a slow load is the startupProbe's
    startup = engine["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    wait = "\n".join(engine["lifecycle"]["preStop"]["exec"]["command"])
    assert f"127.0.0.1:{WarmerSettings.model_fields['http_port'].default}/drained" in wait
    drain = WarmerSettings.model_fields["drain"].default
    bound = re.search(r"time.monotonic\(\) \+ (\d+)", wait)
    assert bound is not None
    waited = int(bound.group(1))
    grace = pod["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert drain.settle_s + drain.timeout_s < waited < grace


def test_the_planner_starts_from_its_config_after_its_own_pod_migrated_the_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every release's planner pods migrate before their planner starts (an init container, so an upgrade
    needs no Job run by hand; the migration's lock makes concurrent pods migrate once)."""
    objects = by_name()
    assert not [kind for kind, _ in objects if kind == "Job"], "migrations run in the planner's pods"
    pod = objects[("Deployment", "warmplane-planner")]
    [migrate] = pod["spec"]["template"]["spec"]["initContainers"]
    planner = container(pod, "planner")
    assert migrate["args"] == ["migrate"] and planner["args"] == ["planner"]
    assert migrate["image"] == planner["image"]
    assert migrate["envFrom"] == [ref for ref in planner["envFrom"] if "warmplane-event-keys" not in str(ref)]
    for key, value in {
        **objects[("ConfigMap", "warmplane")]["data"],
        **objects[("Secret", "warmplane-postgres")]["stringData"],
    }.items():
        monkeypatch.setenv(key, value)
    settings = load_settings(PlannerSettings)
    assert settings.kafka.replication_factor == 3
    assert {"name": "metrics", "containerPort": settings.metrics_port} in planner["ports"]


def _exported_series() -> dict[str, set[str]]:
    """Every series name the services' registries expose (counters as `_total`, histograms' parts), with
    its label names (a histogram's buckets add `le`)."""
    services: list[object] = [
        PlannerMetrics(CollectorRegistry()),
        WarmerMetrics(CollectorRegistry()),
        ApiMetrics(CollectorRegistry()),
        GatewayMetrics(CollectorRegistry()),
    ]
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
    series: dict[str, set[str]] = {}
    for metrics in services:
        # A labelled metric with no child yet exposes no sample: its label names are only on the wrapper.
        for wrapper in vars(metrics).values():
            if isinstance(wrapper, MetricWrapperBase):
                name, labels = wrapper._name, set(wrapper._labelnames)
                series[name] = labels
                for suffix in suffixes.get(str(wrapper._type), ()):
                    series[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return series


def _expressions() -> list[str]:
    """Every PromQL expression of the alert rules and the dashboard's panels."""
    rules = yaml.safe_load((ROOT / "infra" / "prometheus" / "warmplane-rules.yml").read_text())
    expressions = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((ROOT / "infra" / "grafana" / "warmplane-overview.json").read_text())
    return expressions + [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_alert_rules_and_the_dashboard_use_only_metrics_the_services_export() -> None:
    rules = yaml.safe_load((ROOT / "infra" / "prometheus" / "warmplane-rules.yml").read_text())
    assert {rule["alert"] for group in rules["groups"] for rule in group["rules"]} >= {
        "WarmplaneColdStartRatioHigh",
        "WarmplaneWarmFailures",
        "WarmplanePlanDeadlineMissed",
        "WarmplaneWarmerSilent",
        "WarmplanePlannerConsumerLag",
    }
    used = {name for expression in _expressions() for name in re.findall(r"\bwarmplane_[a-z_]+", expression)}
    assert used, "no Warmplane metric is used"
    exported = set(_exported_series())
    assert used <= exported, f"not exported: {sorted(used - exported)}"


# Labels Prometheus adds to every scraped series.
_TARGET_LABELS = {"job", "instance"}


def test_queries_use_only_labels_their_metrics_have() -> None:
    """A selector's labels are the metric's own; a `by (...)` groups on labels of a metric the query
    reads. Either mistake gives an empty panel or an alert that never fires, and no error."""
    exported = _exported_series()
    for expression in _expressions():
        metrics = re.findall(r"\bwarmplane_[a-z_]+", expression)
        if not metrics:  # `up` and other series Prometheus makes itself
            continue
        for name, matchers in re.findall(r"\b(warmplane_[a-z_]+)\{([^}]*)\}", expression):
            selected = set(re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=)", matchers))
            assert selected <= exported[name] | _TARGET_LABELS, f"{name} has no {selected - exported[name]}"
        available = set().union(*(exported[name] for name in metrics)) | _TARGET_LABELS
        for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expression):
            grouped = {label.strip() for label in grouping.split(",") if label.strip()}
            assert grouped <= available, f"{expression!r} groups by {grouped - available}"


def test_every_dashboard_panel_has_a_query_and_a_place_of_its_own() -> None:
    dashboard = json.loads((ROOT / "infra" / "grafana" / "warmplane-overview.json").read_text())
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels), "panel ids repeat"
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["targets"] and panel["title"], panel["id"]
        assert len({target["refId"] for target in panel["targets"]}) == len(panel["targets"]), panel["title"]
        assert panel["datasource"]["uid"].strip("${}") in variables, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, f"{panel['title']} is wider than the dashboard"
        covered = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered


def test_the_cold_start_alert_is_the_seed_documents_rule() -> None:
    rules = yaml.safe_load((ROOT / "infra" / "prometheus" / "warmplane-rules.yml").read_text())
    [cold] = [r for g in rules["groups"] for r in g["rules"] if r["alert"] == "WarmplaneColdStartRatioHigh"]
    assert cold["for"] == "5m" and cold["expr"].strip().endswith("> 0.3")


def test_the_compose_api_is_valid_api_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    service = _compose()["services"]["api"]
    tokens = '[{"name": "ci", "token": "a-token-of-16-chars", "role": "admin"}]'
    for key, raw in service["environment"].items():
        value = tokens if key == "WARMPLANE_API_CALLERS" else str(raw)
        monkeypatch.setenv(key, value.replace("${WARMPLANE_POSTGRES_PASSWORD}", "secret"))
    monkeypatch.setenv("WARMPLANE_EVENT_KEYS", EVENT_KEYS)
    settings = load_settings(ApiSettings)
    assert [t.role for t in settings.api_callers] == ["admin"] and "a-token-of-16-chars" not in repr(settings)
    assert f"{settings.api.http_port}:{settings.api.http_port}" in service["ports"]
    assert "/readyz" in " ".join(service["healthcheck"]["test"])
    assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_the_api_and_gateway_deployments_start_from_their_config_and_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = by_name()
    config = objects[("ConfigMap", "warmplane")]["data"]
    api = container(objects[("Deployment", "warmplane-api")], "api")
    assert api["args"] == ["api"] and api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    secret_names = {ref["secretRef"]["name"] for ref in api["envFrom"] if "secretRef" in ref}
    with monkeypatch.context() as scoped:
        for name in secret_names:
            for key, value in objects[("Secret", name)]["stringData"].items():
                scoped.setenv(key, value)
        for key, value in config.items():
            scoped.setenv(key, value)
        settings = load_settings(ApiSettings)
    assert {"name": "http", "containerPort": settings.api.http_port} in api["ports"]
    assert settings.api_callers[0].role == "admin"

    gateway = container(objects[("Deployment", "warmplane-gateway")], "gateway")
    for ref in gateway["envFrom"]:
        source = objects[("Secret", ref["secretRef"]["name"])]["stringData"] if "secretRef" in ref else config
        for key, value in source.items():
            monkeypatch.setenv(key, value)
    for variable in gateway["env"]:
        monkeypatch.setenv(variable["name"], variable.get("value", "warmplane-gateway-7d9f-x2"))
    gateway_settings = load_settings(GatewaySettings)
    assert gateway_settings.gateway.block_size == 16
    assert {"name": "http", "containerPort": gateway_settings.gateway.http_port} in gateway["ports"]


def _kv_events_config(args: list[str]) -> dict[str, Any]:
    """The engine's `--kv-events-config`, which must switch the events on over ZeroMQ."""
    [config] = [json.loads(arg.split("=", 1)[1]) for arg in args if arg.startswith("--kv-events-config=")]
    assert config["enable_kv_cache_events"] is True and config["publisher"] == "zmq"
    return dict(config)


def test_the_api_and_gateway_metrics_ports_stay_inside_the_cluster() -> None:
    """Per-tenant figures: each /metrics port is declared on its pod, named by no Service, reachable by
    the NetworkPolicy only from a namespace given by name, and in compose exposed but never published."""
    objects = by_name()
    compose = _compose()["services"]
    policy = objects[("NetworkPolicy", "warmplane-metrics-in-cluster")]["spec"]
    for workload, name, port, service in (
        ("warmplane-api", "api", ApiOptions().metrics_port, "api"),
        ("warmplane-gateway", "gateway", GatewayOptions().metrics_port, "gateway"),
    ):
        declared = container(objects[("Deployment", workload)], name)["ports"]
        assert {"name": "metrics", "containerPort": port} in declared
        targets = {p.get("targetPort") for p in objects[("Service", workload)]["spec"]["ports"]}
        assert targets.isdisjoint({"metrics", port}), workload
        [selected] = policy["podSelector"]["matchExpressions"]
        assert workload in selected["values"]
        assert all(not str(published).endswith(f":{port}") for published in compose[service]["ports"])
        assert str(port) in compose[service]["expose"]
    for rule in policy["ingress"]:
        if {"port": "metrics"} in rule["ports"]:
            assert rule["from"] and all("namespaceSelector" in peer for peer in rule["from"])


def test_every_service_that_produces_or_consumes_control_events_holds_the_event_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every Warmplane container but the migrations reads the event-keys Secret, and compose requires them
    of every service; the example's value loads as keys."""
    objects = by_name()
    holders = {
        ("Deployment", "warmplane-planner"): "planner",
        ("Deployment", "warmplane-api"): "api",
        ("Deployment", "warmplane-gateway"): "gateway",
        ("StatefulSet", "vllm"): "warmer",
    }
    for workload, name in holders.items():
        refs = [
            ref["secretRef"]["name"]
            for ref in container(objects[workload], name)["envFrom"]
            if "secretRef" in ref
        ]
        assert "warmplane-event-keys" in refs, name
    for name in ("planner", "warmer", "gateway", "api"):
        assert (
            "${WARMPLANE_EVENT_KEYS:?" in _compose()["services"][name]["environment"]["WARMPLANE_EVENT_KEYS"]
        )
    monkeypatch.setenv(
        "WARMPLANE_EVENT_KEYS",
        objects[("Secret", "warmplane-event-keys")]["stringData"]["WARMPLANE_EVENT_KEYS"],
    )
    monkeypatch.setenv("WARMPLANE_NODE", "gpu-node-0")
    assert len(load_settings(WarmerSettings).event_keys) == 1


_COMPOSE_VARIABLE = re.compile(r"\$\{([A-Z0-9_]+)(?::([?-])([^}]*))?\}")


def _env_example() -> dict[str, str]:
    lines = (ROOT / ".env.example").read_text().splitlines()
    pairs = [line.split("=", 1) for line in lines if line.strip() and not line.startswith("#")]
    return {key: value for key, value in pairs}


def test_the_env_example_sets_what_compose_requires_and_every_service_starts_from_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`cp .env.example .env; docker compose up` interpolates every variable compose refuses to start
    without, and each Warmplane service's environment then loads as its settings."""
    text = (ROOT / "docker-compose.yml").read_text()
    example = _env_example()
    required = {name for name, kind, _ in _COMPOSE_VARIABLE.findall(text) if kind == "?"}
    assert required and all(example.get(name) for name in required), sorted(required - set(example))
    assert ".env" in (ROOT / ".gitignore").read_text().split()

    def interpolated(value: str) -> str:
        return _COMPOSE_VARIABLE.sub(lambda m: example.get(m[1]) or (m[3] if m[2] == "-" else ""), value)

    services = _compose()["services"]
    for name, settings_type in (
        ("planner", PlannerSettings),
        ("warmer", WarmerSettings),
        ("gateway", GatewaySettings),
        ("api", ApiSettings),
    ):
        with monkeypatch.context() as scoped:
            for key, value in services[name]["environment"].items():
                scoped.setenv(key, interpolated(str(value)))
            settings = load_settings(settings_type)
        assert example["WARMPLANE_POSTGRES_PASSWORD"] not in repr(settings), name
