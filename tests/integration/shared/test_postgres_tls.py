"""Postgres over TLS through one URL that `warmplane migrate`, the planner and the API read alike.

The embedded PostgreSQL is built without SSL, so TLS ends in a terminator in front of it that speaks
PostgreSQL's own negotiation (`tls_terminator.py`), with a certificate this test makes (`openssl`). It
closes every connection that does not ask for TLS, and only its port is given out: whatever reaches the
database came over TLS. The URL carries libpq's parameters (`sslmode=verify-full`, `sslrootcert`), as a
platform team's would.
"""

from __future__ import annotations

import shutil
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import asyncpg
import httpx
import pytest
from pydantic import SecretStr

from tests.integration.api_harness import ADMIN, api_settings, bearer, running_api
from tests.integration.planner_harness import (
    planner_environment,
    poll_until,
    produce,
    request,
    run_warmplane,
)
from tests.integration.tls_terminator import TlsTerminator, make_certificates, server_context
from tests.integration.warmer_harness import counted
from tests.real_parts import planner_settings_for
from warmplane.services.planner.app import running_planner
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.embedded.postgres_server import EmbeddedPostgres
from warmplane.shared.settings import PostgresSettings


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make this test's certificates")
    folder = tmp_path_factory.mktemp("tls")
    make_certificates(folder)
    return folder


@pytest.fixture(scope="module")
def plain_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres(tmp_path_factory.mktemp("postgres")) as server:
        yield server


@pytest.fixture
async def tls_postgres(
    plain_postgres: EmbeddedPostgres, certificates: Path
) -> AsyncIterator[tuple[TlsTerminator, EmbeddedPostgres, Path]]:
    context = server_context(str(certificates / "server.pem"), str(certificates / "server.key"))
    async with TlsTerminator(("127.0.0.1", plain_postgres.port), context, postgres=True) as terminator:
        yield terminator, plain_postgres, certificates


def url(port: int, server: EmbeddedPostgres, ca: Path, sslmode: str = "verify-full") -> str:
    return (
        f"postgresql://postgres@127.0.0.1:{port}/{server.database}"
        f"?sslmode={sslmode}&sslrootcert={quote(str(ca))}"
    )


async def test_a_connection_without_tls_or_to_an_unknown_ca_is_refused(
    tls_postgres: tuple[TlsTerminator, EmbeddedPostgres, Path],
) -> None:
    terminator, server, folder = tls_postgres
    with pytest.raises((ConnectionError, asyncpg.PostgresError, OSError)):
        await asyncpg.connect(url(terminator.port, server, folder / "ca.pem", sslmode="disable"))
    assert (terminator.refused, terminator.sessions) == (1, 0)
    with pytest.raises(ssl.SSLCertVerificationError):
        await asyncpg.connect(url(terminator.port, server, folder / "other-ca.pem"))
    assert terminator.sessions == 0
    connection = await asyncpg.connect(url(terminator.port, server, folder / "ca.pem"))
    try:
        assert await connection.fetchval("SELECT 1") == 1
    finally:
        await connection.close()
    assert terminator.sessions == 1


async def test_migrate_the_planner_and_the_api_run_over_one_tls_url(
    tls_postgres: tuple[TlsTerminator, EmbeddedPostgres, Path], embedded_kafka: EmbeddedKafka
) -> None:
    terminator, server, folder = tls_postgres
    dsn = url(terminator.port, server, folder / "ca.pem")
    settings = planner_settings_for(embedded_kafka.bootstrap_servers, dsn)
    assert settings.postgres == PostgresSettings(url=SecretStr(dsn))

    code, output = await run_warmplane(planner_environment(settings), "migrate")
    assert code == 0, output

    async with running_planner(settings):
        await produce(settings.kafka, [request([11, 12]), request([11])])
        await poll_until(
            lambda: counted(dsn, 2), timeout_s=60, what="the planner to count both requests over TLS"
        )
    async with (
        running_api(api_settings(settings)) as api,
        httpx.AsyncClient(base_url=api.url, timeout=10) as client,
    ):
        models = await client.get("/v1/models", headers=bearer(ADMIN))
    assert models.status_code == 200, models.text
    assert terminator.refused == 0 and terminator.sessions >= 3  # migrate, the planner's pool, the API's
    assert models.json() == [request([1]).model.name]  # read from what the planner counted
