"""The deployment files stay consistent with the code: compose services, health checks, settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(document, dict)
    return document


def test_every_long_running_service_has_a_health_check() -> None:
    services = _compose()["services"]
    assert {"kafka", "postgres", "redis", "migrate", "planner"} <= set(services)
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
    settings = load_settings(PlannerSettings)
    assert settings.kafka.bootstrap_servers == "kafka:9092"
    assert "secret" not in repr(settings)


def test_the_image_installs_what_the_package_links() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for linked in (ROOT / "src" / "warmplane").iterdir():
        if linked.is_symlink():
            assert f"COPY {linked.name} " in dockerfile, f"the image misses {linked.name}/"
