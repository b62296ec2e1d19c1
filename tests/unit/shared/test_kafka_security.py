"""Kafka security settings: refused when incoherent, secret where they should be, and turned into the same
connection options for every aiokafka client and for the planner's faststream broker."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from faststream.security import BaseSecurity, SASLScram512
from pydantic import SecretStr, ValidationError

from warmplane.services.planner.app import _security
from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.kafka_clients import client_security
from warmplane.shared.settings import KafkaSecurity, SettingsError, load_settings

CA = str(Path(ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"))


def test_plaintext_is_the_default_and_adds_nothing_but_the_protocol() -> None:
    assert client_security(KafkaSecurity()) == {"security_protocol": "PLAINTEXT"}
    assert _security(KafkaSecurity()) is None


def test_tls_gives_every_client_one_shared_verifying_context() -> None:
    security = KafkaSecurity(protocol="SSL", ca_file=CA)
    options = client_security(security)
    assert options["security_protocol"] == "SSL"
    context = options["ssl_context"]
    assert (context.verify_mode, context.check_hostname) == (ssl.CERT_REQUIRED, True)
    assert client_security(KafkaSecurity(protocol="SSL", ca_file=CA))["ssl_context"] is context  # loaded once
    planner = _security(security)
    assert isinstance(planner, BaseSecurity) and (planner.use_ssl, planner.ssl_context) == (True, context)


def test_a_sasl_login_over_tls_gives_the_mechanism_and_credentials() -> None:
    security = KafkaSecurity(
        protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="planner",
        sasl_password=SecretStr("pw"),
    )
    options = client_security(security)
    assert {k: v for k, v in options.items() if k != "ssl_context"} == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "planner",
        "sasl_plain_password": "pw",
    }
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    planner = _security(security)
    assert isinstance(planner, SASLScram512)
    assert (planner.username, planner.password, planner.use_ssl) == ("planner", "pw", True)


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"ca_file": CA}, "has no TLS"),
        ({"protocol": "SSL", "cert_file": CA}, "both cert_file and key_file"),
        ({"protocol": "SASL_PLAINTEXT", "sasl_username": "u"}, "needs sasl_username and sasl_password"),
        ({"sasl_username": "u"}, "has no SASL login"),
    ],
)
def test_incoherent_security_is_refused_saying_why(fields: dict[str, str], said: str) -> None:
    with pytest.raises(ValidationError, match=said):
        KafkaSecurity.model_validate(fields)


def test_the_sasl_password_is_read_from_the_environment_and_never_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WARMPLANE_KAFKA__SECURITY__PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("WARMPLANE_KAFKA__SECURITY__SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("WARMPLANE_KAFKA__SECURITY__SASL_USERNAME", "planner")
    monkeypatch.setenv("WARMPLANE_KAFKA__SECURITY__SASL_PASSWORD", "s3cret-kafka-password")
    settings = load_settings(PlannerSettings)
    assert settings.kafka.security.sasl_password.get_secret_value() == "s3cret-kafka-password"
    assert "s3cret-kafka-password" not in repr(settings) + str(settings)
    monkeypatch.setenv("WARMPLANE_KAFKA__SECURITY__PROTOCOL", "TLS")
    with pytest.raises(SettingsError, match="WARMPLANE_KAFKA__SECURITY__PROTOCOL"):
        load_settings(PlannerSettings)
