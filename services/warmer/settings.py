"""The warmer's settings: `WARMPLANE_NODE`, `WARMPLANE_ENGINES`, `WARMPLANE_TENANT_SECRETS`,
`WARMPLANE_WARM__*`, `WARMPLANE_READINESS__*` and `WARMPLANE_DRAIN__*` on top of the shared parts.

Example for a node with one engine:
    WARMPLANE_NODE=gpu-node-7
    WARMPLANE_ENGINES='[{"replica": "llama-7-0", "url": "http://127.0.0.1:8000", "served_model": "llama"}]'
    WARMPLANE_TENANT_SECRETS='{"acme": "...", "globex": "..."}'
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, Field, SecretStr, model_validator

from warmplane.shared.kv_blocks import DEFAULT_BLOCK_SIZE
from warmplane.shared.settings import HeartbeatSettings, WarmplaneSettings

Seconds = Annotated[float, Field(gt=0)]
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00]+$")]


class EngineSettings(BaseModel):
    """One local vLLM engine: the replica it is, where it answers, and what it serves."""

    replica: Name
    url: Annotated[str, Field(pattern=r"^https?://[^\s]+$")]
    """Where this warmer reaches the engine: in a pod, its loopback."""
    announce_url: Annotated[str, Field(pattern=r"^https?://[^\s]+$")] | None = None
    """Where routers reach the engine, announced on its lifecycle events: in Kubernetes the pod's IP
    (`http://$(POD_IP):8000`) or its name under a headless Service. Unset, `url`, which is right only
    where the router shares the engine's host."""
    served_model: Name
    """The model name the engine's OpenAI API answers to (`--served-model-name`)."""
    model_revision: Annotated[str, Field(max_length=128)] = ""
    """The weights revision it serves (vLLM does not expose one); goes on its lifecycle events."""
    block_size: Annotated[int, Field(ge=1, le=1024)] = DEFAULT_BLOCK_SIZE
    """The engine's KV block size in tokens (`--block-size`): what a probe counts in."""
    kv_events_endpoint: Annotated[str, Field(pattern=r"^(tcp|ipc)://[^\s]+$")] | None = None
    """Where the engine publishes its KV cache events (the `endpoint` of its `--kv-events-config`, with
    the host it is reached at, e.g. `tcp://127.0.0.1:5557`); unset, residency is known from verified
    plans only and no `replica.residency` is reported."""
    kv_events_replay_endpoint: Annotated[str, Field(pattern=r"^(tcp|ipc)://[^\s]+$")] | None = None
    """The engine's `replay_endpoint`: batches missed (a late start, a dropped message) are asked for
    again there; unset, a gap makes residency incomplete until probes settle it."""
    kv_events_topic: Annotated[str, Field(max_length=128)] = ""
    """The `topic` of the engine's `--kv-events-config`."""

    @model_validator(mode="after")
    def _expanded(self) -> Self:
        for field in ("url", "announce_url"):
            value = getattr(self, field) or ""
            if "$(" in value:
                raise ValueError(
                    f"{field} {value!r} holds an unexpanded Kubernetes variable: declare it in the pod's"
                    " env before WARMPLANE_ENGINES"
                )
        return self

    @property
    def announced_url(self) -> str:
        """The URL lifecycle events announce for this engine."""
        return self.announce_url or self.url


class WarmSettings(BaseModel):
    """How the warmer drives an engine."""

    concurrency: Annotated[int, Field(ge=1, le=256)] = 8
    """Warm requests in flight per engine while the replica is not yet ready."""
    probe_concurrency: Annotated[int, Field(ge=1, le=256)] = 32
    """Probes in flight before ready: each recomputes one block, so the engine batches many cheaply."""
    ready_concurrency: Annotated[int, Field(ge=1, le=256)] = 1
    """In flight once it serves traffic: a real request waits for running warm-ups (design brief, 8)."""
    priority: int = 10
    """vLLM priority of warm and probe requests; real traffic at 0 is served first."""
    connect_timeout_s: Seconds = 2.0
    """To the engine."""
    request_timeout_s: Seconds = 60.0
    """Per warm or probe request; `__ATTEMPTS` (`2`) tries for timeouts and 5xx."""
    health_timeout_s: Seconds = 2.0
    """Per `/health` check."""
    health_interval_s: Seconds = 1.0
    """`/health` checks; `__CRASH_AFTER_FAILURES` (`3`) failed ones mean crashed."""
    crash_after_failures: Annotated[int, Field(ge=1, le=100)] = 3
    """Consecutive failed health checks after which a replica that answered is reported crashed."""
    max_kv_fill: Annotated[float, Field(gt=0, le=1)] = 0.8
    """The share of the engine's KV cache a plan may fill (when the engine reports its size): the rest
    of a larger plan is left out, since a warm set larger than the cache evicts its own beginning."""
    attempts: Annotated[int, Field(ge=1, le=10)] = 2
    """Tries per item for a transient failure (timeout, transport, HTTP 5xx); a rejection is not retried."""
    progress_interval_s: Seconds = 1.0
    """At most this often a running plan's progress is reported."""
    publish_timeout_s: Seconds = 10.0
    """How long publishing one lifecycle or result event may take before it is kept for a retry."""
    residency_interval_s: Seconds = 2.0
    """At most this often a replica's residency is assessed from its KV events and reported if changed."""
    reconcile_interval_s: Seconds = 300.0
    """How often a replica's residency is checked against the engine itself: `reconcile_sample` prefixes
    the events say are held are probed; a miss shows lost events and every unsure prefix is probed."""
    reconcile_sample: Annotated[int, Field(ge=0, le=1_000)] = 4
    """Prefixes probed per reconciliation (`reconcile_interval_s`)."""
    replay_timeout_s: Seconds = 2.0
    """How long a replay of missed KV event batches may take before they count as lost."""


class ReadinessSettings(BaseModel):
    """When `/ready` turns true (design brief, section 8)."""

    plan_wait_s: Seconds = 300.0
    """How long a loaded replica waits for its plan before it turns ready cold (reported as partial)."""
    on_deadline: Literal["ready_partial", "stay_unready"] = "ready_partial"
    """At a plan's deadline with items unverified: serve anyway (a partial warm) or keep waiting."""
    min_verified_fraction: Annotated[float, Field(ge=0, le=1)] = 1.0
    """The share of a plan's items that must verify for ready before its deadline."""
    warm: bool = True
    """False turns warming off on this node: a replica is ready as soon as its engine answers, and its
    plans are refused (reported as such). For a node that must never wait, and for measuring what
    warming buys (`bench.scaleup`'s cold arm); lifecycle, health and residency are reported as usual."""


class DrainSettings(BaseModel):
    """How a replica leaves the fleet when its warmer is told to stop (SIGTERM: a pod deleted, scaled
    down or rolled): `replica.draining_started`, then `replica.stopped` once its engine is idle."""

    settle_s: Annotated[float, Field(ge=0)] = 5.0
    """After announcing the drain, how long routers get to see it and stop sending new requests, before
    the engine's in-flight requests are counted. At least the time a lifecycle event takes to reach every
    gateway (`WARMPLANE_KAFKA__FETCH_MAX_WAIT_MS` and more)."""
    timeout_s: Seconds = 60.0
    """How long in-flight requests may then take to finish before the replica is announced stopped
    anyway. The pod's `terminationGracePeriodSeconds` must exceed `settle_s + timeout_s`."""


class WarmerSettings(WarmplaneSettings):
    node: Name
    """This warmer's own name: plans are addressed to it, and its plans consumer group is named for it.
    One per warmer (in Kubernetes, the pod's name): two warmers under one name split the plans between
    them and refuse each other's."""
    engines: list[EngineSettings] = Field(default_factory=list)
    """JSON list of `{"replica", "url", "served_model", "model_revision", "block_size"}`, and the engine's KV
    events: `"kv_events_endpoint"`, `"kv_events_replay_endpoint"` (below)."""
    tenant_secrets: dict[str, SecretStr] = Field(default_factory=dict)
    """Each tenant's cache-salt secret, shared with the gateway; a tenant without one is never warmed
    (unless it is unsalted)."""
    unsalted_tenants: list[Name] = Field(default_factory=list)
    """Tenants whose requests reach the engines without a `cache_salt`: a router of the team's own that adds
    none, clients that send none. Their prefixes are warmed without a salt, where their traffic reads. What
    it gives up: their KV blocks are shared with every other unsalted request for the same prefix on the
    engine (no tenant isolation of KV blocks). Warmplane's gateway always salts: leave this empty behind it.
    Logged at start."""
    group_id_prefix: Annotated[str, Field(min_length=1)] = "warmplane-warmer"
    """The node's plans consumer group is `<prefix>-<node>`."""
    warm: WarmSettings = WarmSettings()
    readiness: ReadinessSettings = ReadinessSettings()
    drain: DrainSettings = DrainSettings()
    heartbeat: HeartbeatSettings = HeartbeatSettings()
    http_host: str = "0.0.0.0"  # noqa: S104 - a readiness probe reaches the pod from outside it
    http_port: Annotated[int, Field(ge=0, le=65_535)] = 8090
    """Port of `/ready`, `/status`, `/healthz` and `/metrics`; 0 picks a free one."""

    @model_validator(mode="after")
    def _salted_or_not(self) -> Self:
        both = sorted(set(self.unsalted_tenants) & set(self.tenant_secrets))
        if both:
            raise ValueError(f"tenants {both} have a salt secret and are unsalted: which is it?")
        return self

    @model_validator(mode="after")
    def _distinct_replicas(self) -> Self:
        names = [engine.replica for engine in self.engines]
        if len(names) != len(set(names)):
            raise ValueError(f"engines name a replica twice: {sorted(names)}")
        return self
