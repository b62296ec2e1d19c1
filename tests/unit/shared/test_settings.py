"""Settings from the environment: one `WARMPLANE_` prefix, `__` nesting, fail-fast errors, hidden secrets."""

from __future__ import annotations

import json
import os

import pytest
from pydantic import SecretStr, ValidationError
from pydantic_settings import BaseSettings

from warmplane.services.api.settings import ApiSettings
from warmplane.services.cli.api_client import ApiClientSettings
from warmplane.services.gateway.settings import GatewaySettings
from warmplane.services.planner.policy import PolicyKnobs
from warmplane.services.planner.settings import PlannerSettings, PlanSettings
from warmplane.services.planner.trace_eval.params import EvalParams
from warmplane.services.warmer.settings import WarmerSettings
from warmplane.shared.settings import (
    RENAMED,
    PostgresSettings,
    SettingsError,
    load_settings,
    settings_environment,
)

PASSWORD = "hunter2-s3cret"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start each test from an environment without any `WARMPLANE_` variable."""
    for name in list(os.environ):
        if name.upper().startswith("WARMPLANE_"):
            monkeypatch.delenv(name)


def test_defaults_load_without_any_variable() -> None:
    settings = load_settings(PlannerSettings)
    assert settings == PlannerSettings()
    assert settings.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert settings.statistics.bucket_seconds == 60


def test_nested_variables_use_the_prefix_and_double_underscores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMPLANE_KAFKA__BOOTSTRAP_SERVERS", "kafka-0:9092,kafka-1:9092")
    monkeypatch.setenv("WARMPLANE_KAFKA__PARTITIONS", "12")
    monkeypatch.setenv("WARMPLANE_POSTGRES__URL", f"postgresql://app:{PASSWORD}@db:5432/warmplane")
    monkeypatch.setenv("WARMPLANE_STATISTICS__BUCKET_SECONDS", "300")
    monkeypatch.setenv("WARMPLANE_INGEST__GROUP_ID", "planner-eu")
    monkeypatch.setenv("WARMPLANE_PLANS__BUDGET_TOKENS", "50000")
    monkeypatch.setenv("WARMPLANE_PLANS__WINDOW_HOURS", "6")
    monkeypatch.setenv("WARMPLANE_METRICS_PORT", "0")
    monkeypatch.setenv("WARMPLANE_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("KAFKA__PARTITIONS", "99")  # no prefix: not ours

    settings = load_settings(PlannerSettings)

    assert settings.kafka.bootstrap_servers == "kafka-0:9092,kafka-1:9092"
    assert settings.kafka.partitions == 12
    assert settings.postgres.asyncpg_dsn() == f"postgresql://app:{PASSWORD}@db:5432/warmplane"
    assert settings.postgres.sqlalchemy_url() == f"postgresql+asyncpg://app:{PASSWORD}@db:5432/warmplane"
    assert (settings.statistics.bucket_seconds, settings.ingest.group_id) == (300, "planner-eu")
    assert (settings.plans.budget_tokens, settings.plans.window_hours, settings.plans.max_items) == (
        50_000,
        6.0,
        256,
    )
    assert (settings.metrics_port, settings.log_level) == (0, "DEBUG")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("WARMPLANE_KAFKA__BOOTSTRAP_SERVERS", "nope"),
        ("WARMPLANE_KAFKA__BOOTSTRAP_SERVERS", "kafka-0:9092,kafka-1"),
        ("WARMPLANE_KAFKA__PARTITIONS", "0"),
        ("WARMPLANE_KAFKA__TOPIC_PREFIX", "has space"),
        ("WARMPLANE_STATISTICS__BUCKET_SECONDS", "0"),
        ("WARMPLANE_STATISTICS__BUCKET_SECONDS", "86401"),
        ("WARMPLANE_STATISTICS__BUCKET_SECONDS", "a minute"),
        ("WARMPLANE_INGEST__NODE_CACHE_SIZE", "1"),
        ("WARMPLANE_PLANS__BUDGET_TOKENS", "0"),
        ("WARMPLANE_PLANS__BUDGET_TOKENS", "4294967296"),
        ("WARMPLANE_POSTGRES__URL", "mysql://db/warmplane"),
        ("WARMPLANE_METRICS_PORT", "70000"),
        ("WARMPLANE_LOG_LEVEL", "CHATTY"),
    ],
)
def test_a_bad_value_fails_fast_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as raised:
        load_settings(PlannerSettings)
    assert isinstance(raised.value, SystemExit)
    assert f"  {variable}: " in str(raised.value)


def test_every_bad_variable_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMPLANE_KAFKA__BOOTSTRAP_SERVERS", "nope")
    monkeypatch.setenv("WARMPLANE_STATISTICS__BUCKET_SECONDS", "0")
    with pytest.raises(SettingsError) as raised:
        load_settings(PlannerSettings)
    lines = str(raised.value).splitlines()
    assert lines[0] == "invalid settings:"
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "WARMPLANE_KAFKA__BOOTSTRAP_SERVERS",
        "WARMPLANE_STATISTICS__BUCKET_SECONDS",
    ]


@pytest.mark.parametrize("settings", [GatewaySettings, ApiSettings, ApiClientSettings, PlannerSettings])
def test_an_old_name_is_refused_naming_the_new_one(
    monkeypatch: pytest.MonkeyPatch, settings: type[BaseSettings]
) -> None:
    """Every service and the CLI refuse each renamed variable (whichever it read), without its value."""
    for old in RENAMED:
        monkeypatch.setenv(old, "old-value-0123456789")
    with pytest.raises(SettingsError) as raised:
        load_settings(settings)
    lines = str(raised.value).splitlines()
    assert lines[1:] == [f"  {old}: renamed {new}" for old, new in RENAMED.items()]
    assert "old-value" not in str(raised.value)


def test_the_new_names_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMPLANE_TENANT_KEYS", '{"acme": ["acme-key-0123456789"]}')
    monkeypatch.setenv("WARMPLANE_TENANT_SECRETS", '{"acme": "salt-secret"}')
    monkeypatch.setenv(
        "WARMPLANE_API_CALLERS", '[{"name": "ci", "token": "0123456789abcdefg", "role": "admin"}]'
    )
    monkeypatch.setenv("WARMPLANE_CLI_TOKEN", "0123456789abcdefg")
    assert list(load_settings(GatewaySettings).tenant_keys) == ["acme"]
    assert [caller.name for caller in load_settings(ApiSettings).api_callers] == ["ci"]
    assert load_settings(ApiClientSettings).cli_token.get_secret_value() == "0123456789abcdefg"


def test_the_fetch_wait_is_every_consumers_and_the_planner_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMPLANE_KAFKA__FETCH_MAX_WAIT_MS", "250")
    assert load_settings(PlannerSettings).kafka.fetch_max_wait_ms == 250
    assert load_settings(GatewaySettings).kafka.fetch_max_wait_ms == 250


def test_a_tenant_is_salted_or_unsalted_on_a_warmer_never_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMPLANE_NODE", "node-0")
    monkeypatch.setenv("WARMPLANE_UNSALTED_TENANTS", '["open", "acme"]')
    monkeypatch.setenv("WARMPLANE_TENANT_SECRETS", '{"acme": "salt-secret"}')
    with pytest.raises(SettingsError, match=r"\['acme'\] have a salt secret and are unsalted"):
        load_settings(WarmerSettings)
    monkeypatch.setenv("WARMPLANE_TENANT_SECRETS", '{"globex": "salt-secret"}')
    assert load_settings(WarmerSettings).unsalted_tenants == ["open", "acme"]


def test_an_engine_announces_the_address_routers_reach_and_a_k8s_variable_must_be_expanded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WARMPLANE_NODE", "vllm-0")
    engine = {"replica": "vllm-0", "url": "http://127.0.0.1:8000", "served_model": "m"}
    monkeypatch.setenv("WARMPLANE_ENGINES", json.dumps([engine]))
    assert load_settings(WarmerSettings).engines[0].announced_url == "http://127.0.0.1:8000"
    engine["announce_url"] = "http://10.2.0.7:8000"
    monkeypatch.setenv("WARMPLANE_ENGINES", json.dumps([engine]))
    assert load_settings(WarmerSettings).engines[0].announced_url == "http://10.2.0.7:8000"
    engine["announce_url"] = "http://$(POD_IP):8000"  # POD_IP not declared before it in the pod's env
    monkeypatch.setenv("WARMPLANE_ENGINES", json.dumps([engine]))
    with pytest.raises(SettingsError, match=r"unexpanded Kubernetes variable"):
        load_settings(WarmerSettings)


def test_the_planner_plans_for_a_router_that_is_not_its_ring_when_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings(PlannerSettings).routing.mode == "ring"
    monkeypatch.setenv("WARMPLANE_ROUTING__MODE", "spread")
    assert load_settings(PlannerSettings).routing.mode == "spread"
    monkeypatch.setenv("WARMPLANE_ROUTING__MODE", "llm-d")
    with pytest.raises(SettingsError, match="WARMPLANE_ROUTING__MODE"):
        load_settings(PlannerSettings)


def test_an_unparsable_section_fails_fast_naming_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMPLANE_KAFKA", "{not json")
    with pytest.raises(SettingsError, match="WARMPLANE_KAFKA"):
        load_settings(PlannerSettings)


def test_secret_urls_never_print(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMPLANE_POSTGRES__URL", f"postgresql://app:{PASSWORD}@db/warmplane")
    monkeypatch.setenv("WARMPLANE_REDIS__URL", f"redis://:{PASSWORD}@cache:6379/0")
    settings = load_settings(PlannerSettings)
    for text in (repr(settings), str(settings), repr(settings.postgres), str(settings.postgres.url)):
        assert PASSWORD not in text
        assert "db/warmplane" not in text and "cache:6379" not in text
    assert "**********" in repr(settings)
    gateway = load_settings(GatewaySettings)
    assert PASSWORD not in repr(gateway) and PASSWORD in gateway.redis.url.get_secret_value()


def test_a_bad_secret_url_is_named_without_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMPLANE_POSTGRES__URL", f"mysql://app:{PASSWORD}@db/warmplane")
    with pytest.raises(SettingsError) as raised:
        load_settings(PlannerSettings)
    assert "WARMPLANE_POSTGRES__URL" in str(raised.value)
    assert PASSWORD not in str(raised.value)


@pytest.mark.parametrize(
    ("url", "asyncpg", "sqlalchemy"),
    [
        ("postgresql://u@h/d", "postgresql://u@h/d", "postgresql+asyncpg://u@h/d"),
        ("postgresql+asyncpg://u@h/d", "postgresql://u@h/d", "postgresql+asyncpg://u@h/d"),
        ("postgres://u@h/d", "postgres://u@h/d", "postgresql+asyncpg://u@h/d"),
    ],
)
def test_postgres_url_forms(url: str, asyncpg: str, sqlalchemy: str) -> None:
    settings = PostgresSettings(url=SecretStr(url))
    assert (settings.asyncpg_dsn(), settings.sqlalchemy_url()) == (asyncpg, sqlalchemy)


def test_settings_survive_a_trip_through_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    original = PlannerSettings(
        kafka={"bootstrap_servers": "k1:9092,k2:9092", "partitions": 12},
        postgres={"url": "postgresql://u:secret@db:5432/w"},
        metrics_port=0,
    )
    for key, value in settings_environment(original).items():
        monkeypatch.setenv(key, value)
    assert load_settings(PlannerSettings) == original


def test_lists_maps_and_their_secrets_survive_a_trip_through_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = WarmerSettings(
        node="node-1",
        engines=[{"replica": "r0", "url": "http://127.0.0.1:8000", "announce_url": "http://10.0.0.7:8000",
                  "served_model": "m", "block_size": 32}],
        tenant_secrets={"acme": "a-secret"},
        unsalted_tenants=["open"],
        event_keys=["a-shared-event-key-of-32-characters-at-least"],
    )  # fmt: skip
    environment = settings_environment(original)
    assert json.loads(environment["WARMPLANE_TENANT_SECRETS"]) == {"acme": "a-secret"}
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    assert load_settings(WarmerSettings) == original


def test_the_planners_policy_settings_refuse_half_a_seconds_budget_and_inverted_hysteresis(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WARMPLANE_PLANS__WARM_SECONDS", "30")
    monkeypatch.setenv("WARMPLANE_COLD_START__CLEAR_RATIO", "0.5")
    with pytest.raises(SettingsError) as raised:
        load_settings(PlannerSettings)
    message = str(raised.value)
    assert "warm_seconds and prefill_tokens_per_s" in message
    assert "clear_ratio must not exceed alarm_ratio" in message
    monkeypatch.setenv("WARMPLANE_PLANS__PREFILL_TOKENS_PER_S", "2000")
    monkeypatch.setenv("WARMPLANE_COLD_START__CLEAR_RATIO", "0.1")
    monkeypatch.setenv("WARMPLANE_ROUTING__DEPTH", "1")
    settings = load_settings(PlannerSettings)
    assert (settings.plans.warm_seconds, settings.plans.prefill_tokens_per_s) == (30, 2000)
    assert (settings.cold_start.clear_ratio, settings.routing.depth) == (0.1, 1)


def test_counts_per_prefix_must_be_kept_at_least_as_long_as_plans_read_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WARMPLANE_INGEST__DETAIL_RETENTION_HOURS", "12")
    with pytest.raises(SettingsError) as raised:
        load_settings(PlannerSettings)
    assert "detail_retention_hours (12) is shorter than plans.window_hours (24)" in str(raised.value)
    monkeypatch.setenv("WARMPLANE_PLANS__WINDOW_HOURS", "6")
    assert load_settings(PlannerSettings).ingest.detail_retention_hours == 12


def test_sums_per_scope_must_outlive_the_counts_they_are_summed_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMPLANE_INGEST__STATS_RETENTION_HOURS", "24")
    with pytest.raises(SettingsError) as raised:
        load_settings(PlannerSettings)
    assert "detail_retention_hours (25) is longer than stats_retention_hours (24)" in str(raised.value)
    monkeypatch.setenv("WARMPLANE_INGEST__DETAIL_RETENTION_HOURS", "24")
    assert load_settings(PlannerSettings).ingest.stats_retention_hours == 24


def test_the_node_cache_must_forget_well_inside_the_detail_retention(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WARMPLANE_PLANS__WINDOW_HOURS", "1")
    monkeypatch.setenv("WARMPLANE_INGEST__DETAIL_RETENTION_HOURS", "2")
    monkeypatch.setenv("WARMPLANE_INGEST__NODE_CACHE_MAX_AGE_S", "3601")
    with pytest.raises(SettingsError) as raised:
        load_settings(PlannerSettings)
    assert "WARMPLANE_INGEST" in str(raised.value)
    assert "node_cache_max_age_s (3601) is more than half of detail_retention_hours (2 h)" in str(
        raised.value
    )
    monkeypatch.setenv("WARMPLANE_INGEST__NODE_CACHE_MAX_AGE_S", "3600")
    assert load_settings(PlannerSettings).ingest.node_cache_max_age_s == 3600


def test_the_plans_frequency_half_life_is_the_longer_one_and_the_evaluator_measures_the_defaults() -> None:
    with pytest.raises(ValidationError, match=r"frequency_half_life_s \(600\) must be longer than"):
        PlanSettings(half_life_s=900)
    assert PlanSettings(half_life_s=900, frequency_half_life_s=None).frequency_half_life_s is None
    with pytest.raises(ValueError, match=r"frequency half-life \(600 s\) must be longer than the half-life"):
        EvalParams(half_life=900)
    assert EvalParams(half_life=900, frequency_half_life=None).frequency_half_life is None
    plans, knobs, evaluated = PlanSettings(), PolicyKnobs(), EvalParams()
    assert (plans.half_life_s, plans.frequency_half_life_s, plans.capacity_fraction) == (
        evaluated.half_life,
        evaluated.frequency_half_life,
        evaluated.capacity_fraction,
    )
    assert (plans.ramp_window_s, plans.min_reuse_probability) == (evaluated.ramp_window, evaluated.min_reuse)
    assert plans.min_expected_saved_tokens == knobs.min_expected_saved_tokens == evaluated.min_saved_tokens
    assert (knobs.half_life_s, knobs.frequency_half_life_s) == (
        evaluated.half_life,
        evaluated.frequency_half_life,
    )


def test_a_vanished_peers_locks_are_bounded_by_the_session_settings() -> None:
    session = PostgresSettings(statement_timeout_ms=20_000, peer_timeout_s=30).session_settings()
    assert session["statement_timeout"] == "20000"
    assert session["idle_in_transaction_session_timeout"] == session["tcp_user_timeout"] == "30000"
    idle, interval, count = (int(session[f"tcp_keepalives_{k}"]) for k in ("idle", "interval", "count"))
    assert idle + interval * count <= 30  # a silent peer is found within the bound
