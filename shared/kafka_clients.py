"""The connection options every Kafka client of Warmplane takes from `KafkaSecurity`: one home, so the
emitter, the planner's consumer, the warmers, the gateway, the API and the CLI encrypt and log in alike.

`client_security` gives aiokafka's keyword arguments (producer, consumer and admin take the same ones);
the planner hands faststream the same in its terms (`services/planner/app.py`). The TLS context is built
once per set of files and shared by the clients built from it.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

from warmplane.shared.settings import KafkaSecurity


def client_security(security: KafkaSecurity) -> dict[str, Any]:
    """aiokafka's `security_protocol`, `ssl_context` and SASL options for `security` (PLAINTEXT: only the
    protocol). The SASL password is handed over in clear: it is what the client sends."""
    options: dict[str, Any] = {"security_protocol": security.protocol}
    if security.tls:
        options["ssl_context"] = tls_context(security)
    if security.sasl:
        options["sasl_mechanism"] = security.sasl_mechanism
        options["sasl_plain_username"] = security.sasl_username
        options["sasl_plain_password"] = security.sasl_password.get_secret_value()
    return options


def tls_context(security: KafkaSecurity) -> ssl.SSLContext:
    """The client TLS context of `security` (its CA bundle, client certificate, hostname check)."""
    return _context(
        security.ca_file,
        security.cert_file,
        security.key_file,
        None if security.key_password is None else security.key_password.get_secret_value(),
        security.check_hostname,
    )


@functools.lru_cache(maxsize=8)
def _context(
    ca_file: str | None, cert_file: str | None, key_file: str | None, key_password: str | None, check: bool
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca_file)
    context.check_hostname = check
    if cert_file is not None:
        context.load_cert_chain(cert_file, key_file, key_password)
    return context
