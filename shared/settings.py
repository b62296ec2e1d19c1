"""Settings shared by every service: one `WARMPLANE_` prefix, nested with `__`, validated at start-up.

Only a service's `main` builds settings from the environment; everything below it is handed its part.
Secrets are `SecretStr`: they print as `**********` in logs and reprs.
Example: `WARMPLANE_KAFKA__BOOTSTRAP_SERVERS=kafka-0:9092`, `WARMPLANE_POSTGRES__URL=postgresql://...`.
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from warmplane.shared.codec import DEFAULT_MAX_EVENT_BYTES

PositiveInt = Annotated[int, Field(gt=0)]
S = TypeVar("S", bound=BaseSettings)


class KafkaSettings(BaseModel):
    """How to reach the broker and how patient to be with it."""

    bootstrap_servers: str = "127.0.0.1:9092"
    client_id: str = "warmplane"
    topic_prefix: str = Field("warmplane", pattern=r"^[A-Za-z0-9._-]{1,100}$")
    partitions: PositiveInt = 4
    replication_factor: PositiveInt = 1
    request_timeout_ms: PositiveInt = 10_000
    # A real Kafka refuses sessions under 6 s by default; tests on the embedded broker go lower.
    session_timeout_ms: PositiveInt = 10_000
    heartbeat_interval_ms: PositiveInt = 3_000
    max_event_bytes: PositiveInt = DEFAULT_MAX_EVENT_BYTES
    commit_timeout_s: Annotated[float, Field(gt=0)] = 10.0

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_ports(cls, value: str) -> str:
        for server in value.split(","):
            host, _, port = server.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"expected host:port[,host:port...], got {value!r}")
        return value


class PostgresSettings(BaseModel):
    """The Postgres that holds the planner's state. The URL may hold a password: it is a secret."""

    url: SecretStr = SecretStr("postgresql://postgres@127.0.0.1:5432/warmplane")
    pool_size: PositiveInt = 4
    connect_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    statement_timeout_ms: PositiveInt = 30_000

    @field_validator("url")
    @classmethod
    def _postgres_scheme(cls, value: SecretStr) -> SecretStr:
        scheme = value.get_secret_value().split("://", 1)[0]
        if scheme not in {"postgresql", "postgres", "postgresql+asyncpg"}:
            raise ValueError("expected a postgresql:// URL")
        return value

    def asyncpg_dsn(self) -> str:
        """The URL as asyncpg takes it (no SQLAlchemy driver suffix)."""
        return self.url.get_secret_value().replace("postgresql+asyncpg://", "postgresql://", 1)

    def sqlalchemy_url(self) -> str:
        """The URL as SQLAlchemy's async engine and alembic take it."""
        dsn = self.asyncpg_dsn()
        return "postgresql+asyncpg://" + dsn.split("://", 1)[1]


class RedisSettings(BaseModel):
    url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    socket_timeout_s: Annotated[float, Field(gt=0)] = 2.0


class WarmplaneSettings(BaseSettings):
    """The base of every service's settings: the parts all of them reach."""

    model_config = SettingsConfigDict(
        env_prefix="WARMPLANE_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    kafka: KafkaSettings = KafkaSettings()
    postgres: PostgresSettings = PostgresSettings()
    redis: RedisSettings = RedisSettings()
    log_level: str = Field("INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")


class SettingsError(SystemExit):
    """Raised at start-up for settings that do not validate; its text names each bad variable."""


def load_settings(cls: type[S]) -> S:
    """Build `cls` from the environment, or fail fast naming every bad `WARMPLANE_...` variable."""
    try:
        return cls()
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix", ""))
        lines = [
            f"  {prefix}{'__'.join(str(part) for part in error['loc']).upper()}: {error['msg']}"
            for error in exc.errors(include_url=False, include_input=False)
        ]
        raise SettingsError("invalid settings:\n" + "\n".join(lines)) from None
