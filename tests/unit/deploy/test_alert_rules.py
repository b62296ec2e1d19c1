"""The alert rules evaluated for real: promtool checks their syntax and runs the unit tests under
infra/prometheus/tests/, where each alert is fed with series and expected to fire (or not) at given
minutes. promtool comes from `make promtool` (infra/prometheus/install-promtool.sh); `make test` runs it."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
PROMETHEUS = ROOT / "infra" / "prometheus"
RULES = PROMETHEUS / "warmplane-rules.yml"
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))
DASHBOARD = ROOT / "infra" / "grafana" / "warmplane-overview.json"


@pytest.fixture(scope="module")
def promtool() -> Path:
    path = ROOT / ".warmplane" / "tools" / "promtool"
    if not path.is_file():
        pytest.fail(
            f"promtool is missing at {path}: run `make promtool` (infra/prometheus/install-promtool.sh)"
        )
    return path


def _run(promtool: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_rules_file_passes_promtools_check(promtool: Path) -> None:
    result = _run(promtool, "check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    rules = yaml.safe_load(RULES.read_text())
    count = sum(len(group["rules"]) for group in rules["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout


@pytest.mark.parametrize("rule_test", RULE_TESTS, ids=[path.stem for path in RULE_TESTS])
def test_the_alerts_fire_as_their_unit_tests_expect(promtool: Path, rule_test: Path) -> None:
    result = _run(promtool, "test", "rules", rule_test)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test() -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    tested = {
        case["alertname"]
        for path in RULE_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]  # an alert only ever expected silent is not shown to fire
    }
    assert alerts <= tested, f"alerts no test makes fire: {sorted(alerts - tested)}"


def test_a_wrong_expectation_fails(promtool: Path, tmp_path: Path) -> None:
    """The runner would catch a broken alert: the cold-start test moved one minute early must fail."""
    source = PROMETHEUS / "tests" / "cold-start.yml"
    document = yaml.safe_load(source.read_text())
    document["rule_files"] = [str(RULES)]
    [case] = [
        c for c in document["tests"][0]["alert_rule_test"] if c["exp_alerts"] and c["eval_time"] == "19m"
    ]
    case["eval_time"] = "18m"
    moved = tmp_path / "cold-start-early.yml"
    moved.write_text(yaml.safe_dump(document))
    result = _run(promtool, "test", "rules", moved)
    assert result.returncode != 0
    assert "WarmplaneColdStartRatioHigh, time: 18m" in result.stdout + result.stderr


def test_the_dashboards_queries_are_valid_promql(promtool: Path, tmp_path: Path) -> None:
    """Each panel's query, as a recording rule, through promtool's parser (Grafana's interval variables
    stand in as 5m)."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    rules = [
        {"record": f"panel_{panel['id']}_{target['refId']}", "expr": re.sub(r"\$__\w+", "5m", target["expr"])}
        for panel in panels
        for target in panel["targets"]
    ]
    queries = tmp_path / "dashboard-queries.yml"
    queries.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = _run(promtool, "check", "rules", queries)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
