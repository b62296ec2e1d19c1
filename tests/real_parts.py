"""The real parts: Kafka (Tansu), PostgreSQL 18 and Redis, one of each per test session, and vLLM.

Each fixture starts its part lazily, the first time a test asks for it, in a temporary folder of its
own (not pytest's ``tmp_path_factory``, whose clean-up of old sessions would delete the data of a
concurrently running session); the ``with`` block guarantees the part is stopped at session end even
when tests fail. Tests that stop or kill a part must start their own instance instead.
Registered once, from the root conftest (``pytest_plugins``), so that the integration and end-to-end tiers
share one instance of each part per session; unit tests never ask for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from pydantic import SecretStr

from tests.integration.light_install import BesideVllm, build_wheel, install_beside_vllm
from warmplane.services.gateway.embedders import model_folder
from warmplane.services.planner.settings import IngestSettings, PlannerSettings, PlanSettings
from warmplane.shared import migrate
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres, EmbeddedRedis
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm, ensure_tiny_model
from warmplane.shared.settings import KafkaSettings, PostgresSettings


@contextlib.contextmanager
def _workdir(part: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"warmplane-test-{part}-") as folder:
        yield Path(folder)


@pytest.fixture(scope="session")
def embedded_kafka() -> Iterator[EmbeddedKafka]:
    """A running in-memory Tansu broker shared by the session."""
    with _workdir("kafka") as workdir, EmbeddedKafka(workdir) as kafka:
        yield kafka


@pytest.fixture(scope="session")
def embedded_postgres() -> Iterator[EmbeddedPostgres]:
    """A running PostgreSQL 18 server with database ``warmplane``, shared by the session."""
    with _workdir("postgres") as workdir, EmbeddedPostgres(workdir) as postgres:
        yield postgres


@pytest.fixture(scope="session")
def embedded_redis() -> Iterator[EmbeddedRedis]:
    """A running Redis server (no persistence) shared by the session."""
    with _workdir("redis") as workdir, EmbeddedRedis(workdir) as redis:
        yield redis


@contextlib.asynccontextmanager
async def fresh_database(server: EmbeddedPostgres) -> AsyncIterator[str]:
    """A new database on `server`, migrated to head; its asyncpg DSN. Dropped on exit."""
    name = f"wp_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server.asyncpg_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = server.asyncpg_dsn.rsplit("/", 1)[0] + f"/{name}"
    await asyncio.to_thread(migrate.upgrade, "postgresql+asyncpg://" + dsn.split("://", 1)[1])
    try:
        yield dsn
    finally:
        admin = await asyncpg.connect(server.asyncpg_dsn)
        try:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@pytest.fixture
async def migrated_database(embedded_postgres: EmbeddedPostgres) -> AsyncIterator[str]:
    """A fresh database, migrated to head, on the session's server; its asyncpg DSN. Dropped after."""
    async with fresh_database(embedded_postgres) as dsn:
        yield dsn


def planner_settings_for(kafka_servers: str, dsn: str) -> PlannerSettings:
    """Settings for a planner of its own: fresh topics, group and database; short group sessions."""
    run = uuid.uuid4().hex[:8]
    return PlannerSettings(
        kafka=KafkaSettings(
            bootstrap_servers=kafka_servers,
            topic_prefix=f"t{run}",
            partitions=4,
            session_timeout_ms=2_000,
            heartbeat_interval_ms=500,
        ),
        postgres=PostgresSettings(url=SecretStr(dsn)),
        ingest=IngestSettings(group_id=f"planner-{run}", batch_timeout_ms=50),
        # Test prefixes are a few hundred tokens: no floor on a plan's expected saving unless a test sets one.
        plans=PlanSettings(min_expected_saved_tokens=0),
        metrics_port=0,
    )


@pytest.fixture
def planner_settings(embedded_kafka: EmbeddedKafka, migrated_database: str) -> PlannerSettings:
    """Settings for a planner of its own: fresh topics, group and database; short group sessions."""
    return planner_settings_for(embedded_kafka.bootstrap_servers, migrated_database)


@pytest.fixture(scope="session")
def vllm_engine() -> Iterator[EmbeddedVllm]:
    """A running vLLM (CPU) server on the tiny model, shared by the session; needs ``make vllm`` first."""
    model_dir = ensure_tiny_model()
    with _workdir("vllm") as workdir, EmbeddedVllm(workdir, model_dir) as engine:
        yield engine


@pytest.fixture(scope="session")
def embedding_engine() -> Iterator[EmbeddedVllm]:
    """vLLM serving the result cache's embedding model (all-MiniLM-L6-v2, `/v1/embeddings`) as `minilm`."""
    with (
        _workdir("vllm-embedding") as workdir,
        EmbeddedVllm(workdir, model_folder(), served_model_name="minilm", pooling=True) as engine,
    ):
        yield engine


@pytest.fixture
def own_engine() -> Iterator[EmbeddedVllm]:
    """A running engine of the test's own (to kill, restart, or fill), the tiny model; always stopped."""
    with (
        _workdir("vllm-own") as workdir,
        EmbeddedVllm(workdir, ensure_tiny_model(), omp_threads_bind=1) as engine,
    ):
        yield engine


@pytest.fixture(scope="session")
def light_wheel(pytestconfig: pytest.Config) -> Iterator[Path]:
    """The light distribution's wheel, built from this checkout once per session."""
    with _workdir("wheel") as workdir:
        yield build_wheel(pytestconfig.rootpath, workdir)


@pytest.fixture(scope="session")
def light_beside_vllm(light_wheel: Path) -> Iterator[BesideVllm]:
    """The light distribution installed for the vLLM environment's interpreter (`light_install.py`)."""
    with _workdir("beside-vllm") as workdir:
        yield install_beside_vllm(light_wheel, workdir / "site")
