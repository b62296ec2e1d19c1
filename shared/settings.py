"""Settings shared by every service: one `WARMPLANE_` prefix, nested with `__`, validated at start-up.

Only a service's `main` builds settings from the environment; everything below it is handed its part.
Secrets are `SecretStr`: they print as `**********` in logs and reprs.
Example: `WARMPLANE_KAFKA__BOOTSTRAP_SERVERS=kafka-0:9092`, `WARMPLANE_POSTGRES__URL=postgresql://...`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Annotated, Final, Literal, Self, TypeVar

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as PydanticSettingsError

from warmplane.shared.codec import DEFAULT_MAX_EVENT_BYTES
from warmplane.shared.hash_ring import DEFAULT_LOAD_FACTOR, DEFAULT_VNODES

PositiveInt = Annotated[int, Field(gt=0)]
S = TypeVar("S", bound=BaseSettings)
MIN_KEY_CHARS = 16
"""The shortest API key (gateway) or bearer token (API) a service starts with: a guessable key is no key."""
MIN_EVENT_KEY_CHARS = 32
"""The shortest key that signs control events (HMAC-SHA256, `event_signing.py`)."""


class KafkaSecurity(BaseModel):
    """How every Kafka client of a service, and the CLI's, encrypts and authenticates its connections
    (`WARMPLANE_KAFKA__SECURITY__*`); `kafka_clients.client_security` turns it into the clients' options."""

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """Kafka's `security.protocol`: TLS with `SSL` and `SASL_SSL`, a SASL login with `SASL_*`."""
    ca_file: str | None = None
    """PEM bundle of the CAs the broker's certificate must chain to; unset, the system's."""
    cert_file: str | None = None
    """PEM client certificate, for a broker that asks for one (mutual TLS); with `key_file`."""
    key_file: str | None = None
    key_password: SecretStr | None = None
    """The client key's passphrase, if it has one; a secret: never logged."""
    check_hostname: bool = True
    """Whether the broker's certificate must name the host connected to."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    sasl_username: str = ""
    sasl_password: SecretStr = SecretStr("")
    """A secret: never logged."""

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        tls_files = [name for name in ("ca_file", "cert_file", "key_file") if getattr(self, name)]
        if tls_files and not self.tls:
            raise ValueError(f"{tls_files} are set but protocol {self.protocol} has no TLS (SSL, SASL_SSL)")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs both cert_file and key_file")
        if self.sasl and not (self.sasl_username and self.sasl_password.get_secret_value()):
            raise ValueError(f"protocol {self.protocol} needs sasl_username and sasl_password")
        if not self.sasl and self.sasl_username:
            raise ValueError(f"sasl_username is set but protocol {self.protocol} has no SASL login")
        return self


class KafkaSettings(BaseModel):
    """How to reach the broker and how patient to be with it."""

    bootstrap_servers: str = "127.0.0.1:9092"
    """The Kafka cluster."""
    client_id: str = "warmplane"
    """Prefix of the client ids each service gives the broker (its logs and quotas name them)."""
    topic_prefix: str = Field("warmplane", pattern=r"^[A-Za-z0-9._-]{1,100}$")
    """Topics are `<prefix>.requests`, `.misses`, `.lifecycle`, `.heartbeats`, `.plans`, `.warm-results`,
    `.dead-letter`."""
    partitions: PositiveInt = 4
    """Partitions of the topics Warmplane creates."""
    replication_factor: PositiveInt = 1
    """Replicas of each topic Warmplane creates (3 on a production cluster)."""
    request_timeout_ms: PositiveInt = 10_000
    """How long one request to the broker may take before the client gives up on it."""
    # A real Kafka refuses sessions under 6 s by default; tests on the embedded broker go lower.
    session_timeout_ms: PositiveInt = 10_000
    heartbeat_interval_ms: PositiveInt = 3_000
    """How often a consumer tells its group it is alive (a third of the session timeout or less)."""
    fetch_max_wait_ms: PositiveInt = 500
    """How long the broker may hold a consumer's fetch while it has nothing new (Kafka's own default). Apache
    Kafka answers as soon as a record arrives, so the wait adds no latency there and a short one only
    multiplies empty round trips; the embedded broker answers when the wait ends, so there it is also how
    late a quiet topic's record is seen (`python -m bench.broker_poll_bench` measures both)."""
    max_event_bytes: PositiveInt = DEFAULT_MAX_EVENT_BYTES
    """Larger events are dead-lettered."""
    commit_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    """How long committing consumed offsets may take before the consumer stops and says so."""
    lag_interval_s: Annotated[float, Field(gt=0)] = 10.0
    """How often a service reads its consumers' lag into its metrics (one broker round trip each)."""
    security: KafkaSecurity = KafkaSecurity()

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
    """A secret: never logged."""
    pool_size: PositiveInt = 4
    """Connections each service keeps open."""
    connect_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    """How long opening a connection may take."""
    statement_timeout_ms: PositiveInt = 30_000
    """Longest a statement may run before Postgres cancels it."""
    peer_timeout_s: Annotated[float, Field(ge=1, le=3600)] = 30.0
    """About how long a connection whose other end vanished (its host cut off mid-transaction) may hold its
    locks before the server ends it: a transaction left idle this long is aborted, and a connection whose
    peer stops answering TCP is dropped (keepalives, `tcp_user_timeout`). Without it the kernel's defaults
    let a cut-off planner's locks stop every other planner of its group for about two hours."""

    def session_settings(self) -> dict[str, str]:
        """The server's session settings each connection sets (`statement_timeout_ms`, `peer_timeout_s`);
        the TCP ones are ignored on a Unix socket."""
        peer = self.peer_timeout_s
        return {
            "statement_timeout": str(self.statement_timeout_ms),
            "idle_in_transaction_session_timeout": str(round(peer * 1000)),
            "tcp_keepalives_idle": str(max(1, round(peer / 3))),
            "tcp_keepalives_interval": str(max(1, round(peer / 6))),
            "tcp_keepalives_count": "3",
            "tcp_user_timeout": str(round(peer * 1000)),
        }

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
    """The gateway's result cache (exact answers); a secret: never logged."""
    socket_timeout_s: Annotated[float, Field(gt=0)] = 2.0
    """Longest wait for one Redis reply."""


class HeartbeatSettings(BaseModel):
    """Liveness of replicas whose warmer goes without a word (its node lost): the warmers send, the planner
    judges. Set alike on both (one ConfigMap)."""

    interval_s: Annotated[float, Field(gt=0, le=3600)] = 10.0
    """A warmer says each of its replicas is alive this often (`replica.heartbeat`)."""
    missed: Annotated[int, Field(ge=2, le=100)] = 3
    """A replica unheard for this many intervals, while the rest of the fleet was heard, is marked lost
    (`replica.lost`): a stop, which routers and plans follow. A fleet that falls silent together (the
    broker, or the planner, away) is not judged; nor is a model's only replica."""

    @property
    def timeout_s(self) -> float:
        return self.interval_s * self.missed


class RingSettings(BaseModel):
    """The routing ring (`shared/hash_ring.py`), `WARMPLANE_ROUTING__*`: the gateway routes by it and the
    planner plans by it, so both read these from one ConfigMap; a mismatch warms prefixes routed elsewhere."""

    depth: Annotated[int, Field(ge=0, le=64)] = 0
    """The chain element requests are routed by (0: the root; the last one for a shorter chain). Deeper
    spreads traffic that shares a system prompt."""
    vnodes: Annotated[int, Field(ge=1, le=4096)] = DEFAULT_VNODES
    """Points each replica has on the ring."""
    load_factor: Annotated[float, Field(ge=1)] = DEFAULT_LOAD_FACTOR
    """A replica takes at most this times its weighted share of the requests in flight (bounded load)."""


class StatisticsSettings(BaseModel):
    """How the planner's statistics are stored, which the API reads them by: one variable for both."""

    bucket_seconds: Annotated[int, Field(ge=1, le=86_400)] = 60
    """Width of a statistics time bucket: requests are counted per bucket, and the API's windows are whole
    buckets. Change it only on an empty database (stored buckets keep the width they were counted in)."""


class WarmplaneSettings(BaseSettings):
    """The base of every service's settings: the broker all of them reach, and logging. A service
    declares only the parts it uses (`DatabaseSettings`, a Redis of its own), so its settings, and the
    reference generated from them (`docs/settings.md`), list nothing it ignores."""

    model_config = SettingsConfigDict(
        env_prefix="WARMPLANE_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    kafka: KafkaSettings = KafkaSettings()
    log_level: str = Field("INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")
    """DEBUG, INFO, WARNING or ERROR."""
    event_keys: list[SecretStr] = Field(default_factory=list, max_length=2)
    """Keys that sign control events (lifecycle, epoch, plans; `event_signing.py`): the first signs, either
    verifies (rotation: add the new key second, then swap, then drop the old). Empty: nothing is signed or
    checked. Secrets, shared by every Warmplane service."""

    @field_validator("event_keys")
    @classmethod
    def _long_event_keys(cls, keys: list[SecretStr]) -> list[SecretStr]:
        if any(len(key.get_secret_value()) < MIN_EVENT_KEY_CHARS for key in keys):
            raise ValueError(f"event keys must be at least {MIN_EVENT_KEY_CHARS} characters")
        return keys


class DatabaseSettings(WarmplaneSettings):
    """The settings of a service that reads or writes Warmplane's Postgres (the planner, the API, the
    gateway's registry seed, `warmplane migrate`)."""

    postgres: PostgresSettings = PostgresSettings()


RENAMED: Final = {
    "WARMPLANE_API_KEYS": "WARMPLANE_TENANT_KEYS",
    "WARMPLANE_API_TOKENS": "WARMPLANE_API_CALLERS",
    "WARMPLANE_API_TOKEN": "WARMPLANE_CLI_TOKEN",
    "WARMPLANE_INGEST__FETCH_MAX_WAIT_MS": "WARMPLANE_KAFKA__FETCH_MAX_WAIT_MS",
    "WARMPLANE_INGEST__BUCKET_SECONDS": "WARMPLANE_STATISTICS__BUCKET_SECONDS",
    "WARMPLANE_API__BUCKET_SECONDS": "WARMPLANE_STATISTICS__BUCKET_SECONDS",
}
"""Old name → new name. The API's three differed by a letter and meant three things (the gateway's tenant
keys, the API's callers, the CLI's own token); the planner's fetch wait is now every consumer's; the bucket
width, which the planner and the API had to keep equal by hand, is one variable both read. An old name set
is refused, never silently ignored."""


class SettingsError(SystemExit):
    """Raised at start-up for settings that do not validate; its text names each bad variable."""


def refuse_renamed(environ: Mapping[str, str]) -> None:
    """Fail naming the new name of every renamed variable `environ` still sets."""
    lines = [f"  {old}: renamed {new}" for old, new in RENAMED.items() if old in environ]
    if lines:
        raise SettingsError("invalid settings:\n" + "\n".join(lines))


def load_settings(cls: type[S]) -> S:
    """Build `cls` from the environment, or fail fast naming every bad `WARMPLANE_...` variable (and every
    renamed one still set)."""
    refuse_renamed(os.environ)
    try:
        return cls()
    except PydanticSettingsError as exc:  # a nested setting given as malformed JSON
        field = re.search(r'field "([^"]+)"', str(exc))
        name = f"{cls.model_config.get('env_prefix', '')}{field.group(1).upper()}" if field else "a setting"
        raise SettingsError(f"invalid settings:\n  {name}: not valid JSON ({exc})") from None
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix", ""))
        lines = [
            f"  {prefix}{'__'.join(str(part) for part in error['loc']).upper()}: {error['msg']}"
            for error in exc.errors(include_url=False, include_input=False)
        ]
        raise SettingsError("invalid settings:\n" + "\n".join(lines)) from None


class EmitterSettings(BaseModel):
    """How the event emitter embedded in a serving stack buffers, batches and gives up (`emitter.py`).

    Sizes are events or bytes as named; times are seconds (`_s`) or milliseconds (`_ms`). The buffer is
    bounded both ways; an event that does not fit is dropped and counted, never waited for.
    """

    client_id: Annotated[str, Field(min_length=1, max_length=128)] = "warmplane-emitter"
    """The producer's client id at the broker."""
    # aiokafka keeps one request in flight per connection; a second one lets client and broker overlap.
    connections: Annotated[int, Field(ge=1, le=8)] = 2
    buffer_max_events: PositiveInt = 100_000
    """Events the buffer holds at most; beyond it events are dropped and counted."""
    buffer_max_bytes: PositiveInt = 64 * 1024 * 1024
    """Bytes the buffer holds at most; beyond it events are dropped and counted."""
    # Events the sender takes off one topic's queue per cycle (split across its partitions); a cycle holds
    # the event loop for about 1 µs an event, so this also bounds the sender's pauses of the serving code.
    batch_max_events: PositiveInt = 2_000
    # Kafka's default message.max.bytes is about 1 MiB: a larger batch would be refused whole.
    batch_max_bytes: Annotated[int, Field(ge=16 * 1024, le=8 * 1024 * 1024)] = 1_000_000
    # How long an event may wait for companions before a batch that is not full goes out.
    linger_ms: Annotated[float, Field(ge=0, le=10_000)] = 5.0
    max_payload_bytes: PositiveInt = 64 * 1024
    """A prefix payload larger than this is left off its event (the event still goes)."""
    send_timeout_s: Annotated[float, Field(gt=0)] = 10.0  # bounds handing one batch to the producer
    send_retries: Annotated[int, Field(ge=0, le=100)] = 3  # after the first attempt; then `send_failed`
    retry_backoff_min_s: Annotated[float, Field(gt=0)] = 0.1
    """First wait before a failed batch is sent again; it doubles up to the maximum."""
    retry_backoff_max_s: Annotated[float, Field(gt=0)] = 5.0
    """Longest wait between two sends of a failed batch."""
    connect_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    """How long starting the producer (reaching the broker) may take."""
    close_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    """How long closing may take to send what is buffered; the rest is dropped and counted."""
    acks: Literal["all", "1"] = "all"
    """`all`: a batch counts as sent once every in-sync replica has it; `1`: once the leader has it."""
    # Only codecs whose library is installed work; the emitter refuses the others at construction.
    compression: Literal["gzip", "lz4", "zstd"] | None = None
    # Partition keys whose murmur2 is remembered (murmur2 costs 3-4 µs in Python; 0 disables the cache).
    key_hash_cache_size: Annotated[int, Field(ge=0)] = 65_536

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.retry_backoff_min_s > self.retry_backoff_max_s:
            raise ValueError("retry_backoff_min_s must not exceed retry_backoff_max_s")
        if self.batch_max_events > self.buffer_max_events:
            raise ValueError("batch_max_events must not exceed buffer_max_events")
        return self


def settings_environment(settings: BaseSettings) -> dict[str, str]:
    """`settings` as the environment variables that reproduce them in another process.

    Nested models flatten with `__` under the class's prefix; lists and maps are JSON, as the settings read
    them; secrets are revealed (the result is for a child process's environment, never for a log).
    """
    prefix = str(settings.model_config.get("env_prefix", ""))
    environment: dict[str, str] = {}

    def flatten(path: str, value: object) -> None:
        if isinstance(value, BaseModel):
            for name in type(value).model_fields:
                flatten(f"{path}__{name.upper()}" if path else name.upper(), getattr(value, name))
        elif isinstance(value, SecretStr):
            environment[prefix + path] = value.get_secret_value()
        elif isinstance(value, list | tuple | set | frozenset | dict):
            environment[prefix + path] = json.dumps(_revealed(value))
        elif value is not None:
            environment[prefix + path] = str(value)

    flatten("", settings)
    return environment


def _revealed(value: object) -> object:
    """`value` as plain JSON data, secrets as their values."""
    if isinstance(value, BaseModel):
        return {name: _revealed(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, dict):
        return {str(key): _revealed(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_revealed(item) for item in value]
    return value
