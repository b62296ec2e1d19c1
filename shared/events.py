"""The versioned event contract: one envelope, every family of the design brief (section 4).

Every event is a JSON object whose `type` names what happened, in the past tense, and whose
`schema_version` says which shape of that type it is. Within a version, changes are additive only:
new optional fields, never a removed or retyped one; readers ignore fields they do not know. A breaking
change is a new version, and the golden payloads in `tests/golden/` keep decoding forever.

Prefix ids are signed 64-bit integers (they fit Postgres `bigint`), produced by `prefix_chain`.
Token counts are engine tokens where the producer knows them, estimates otherwise.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from msgspec import Meta, Struct

SCHEMA_VERSION = 1
"""The newest schema version this code writes and reads, for every event type."""

# Bounded names. A regex forbidding NUL here cost 2 us a decode (more than the rest of it): traffic
# events check NUL in `__post_init__`, and the planner dead-letters any other value Postgres refuses.
Name = Annotated[str, Meta(min_length=1, max_length=128)]
OptionalName = Annotated[str, Meta(max_length=128)]
Tokens = Annotated[int, Meta(ge=0, le=2**31 - 1)]
"""A token count: far above any context length, and within a 32-bit column."""
Epoch = Annotated[int, Meta(ge=0, le=2**62)]
AwareTime = Annotated[datetime, Meta(tz=True)]
PrefixId = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
MAX_CHAIN_LENGTH = 4096
MAX_RESIDENT_PREFIXES = 100_000
"""Most prefix ids one residency report carries (800 kB of ids: within the broker's message limit)."""


class ModelRef(Struct, frozen=True, gc=False):
    """A served model: its name as clients ask for it, and the weights revision being served."""

    name: Name
    revision: OptionalName = ""


class Event(Struct, kw_only=True, frozen=True, tag_field="type", gc=False):
    """The envelope every event shares. `event_id` is the idempotency key of every consumer.

    Events hold no reference cycles, so they are not tracked by the cyclic garbage collector
    (`gc=False`): a planner holding batches of them pays no collector pauses for them.
    """

    FAMILY: ClassVar[str] = ""

    event_id: uuid.UUID
    schema_version: Annotated[int, Meta(ge=1)] = SCHEMA_VERSION
    occurred_at: AwareTime
    producer: Name
    tenant: OptionalName = ""
    model: ModelRef
    prompt_rev: OptionalName = ""
    epoch: Epoch | None = None


class PrefixPayload(Struct, frozen=True, gc=False):
    """A replayable prompt up to the deepest segment of a chain, for the prefix catalog.

    Exactly one of `messages` (chat, OpenAI message objects) or `prompt` (completions: text or
    token ids) is set. `prefix_id` is the chain element the payload renders up to.
    """

    prefix_id: PrefixId
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("a prefix payload carries exactly one of `messages` or `prompt`")


class _TrafficEvent(Event, kw_only=True, frozen=True):
    """A request or miss: always tenant-scoped, keyed by (tenant, model, root prefix)."""

    tenant: Name
    replica: Name
    chain: Annotated[list[PrefixId], Meta(min_length=1, max_length=MAX_CHAIN_LENGTH)]
    chain_tokens: Annotated[list[Tokens], Meta(min_length=1, max_length=MAX_CHAIN_LENGTH)]

    def __post_init__(self) -> None:
        if "\x00" in f"{self.tenant}{self.replica}{self.model.name}{self.model.revision}{self.prompt_rev}":
            raise ValueError("names must not contain NUL")
        tokens = self.chain_tokens
        if len(self.chain) != len(tokens):
            raise ValueError("`chain` and `chain_tokens` must have the same length")
        # Runs on every decode: one comparison in C (sorted is linear on sorted input) beats a loop.
        if len(tokens) > 1 and tokens != sorted(tokens):
            raise ValueError("`chain_tokens` are cumulative and must not decrease")


class RequestObserved(_TrafficEvent, kw_only=True, frozen=True, tag="request.observed"):
    """A serving node answered a request. `chain_tokens[i]` counts the tokens up to `chain[i]`."""

    FAMILY = "request"

    prompt_tokens: Tokens
    cached_tokens: Tokens = 0
    ttft_ms: Annotated[float, Meta(ge=0)] | None = None
    route: OptionalName = ""
    payload: PrefixPayload | None = None

    def __post_init__(self) -> None:
        _TrafficEvent.__post_init__(self)
        if self.cached_tokens > self.prompt_tokens:
            raise ValueError("`cached_tokens` cannot exceed `prompt_tokens`")
        if self.payload is not None and self.payload.prefix_id not in self.chain:
            raise ValueError("`payload.prefix_id` must be an element of `chain`")


class PrefixMissed(_TrafficEvent, kw_only=True, frozen=True, tag="prefix.missed"):
    """A request whose leading prefix was not resident where it was served (the seed's "miss").

    `chain` is the request's chain; `resident_depth` counts its leading elements that were cached.
    """

    FAMILY = "miss"

    resident_depth: Tokens = 0
    cached_tokens: Tokens = 0


ReplicaState = Literal["starting", "loading", "warming", "ready", "draining", "gone", "failed"]
LIVE_REPLICA_STATES: frozenset[ReplicaState] = frozenset({"starting", "loading", "warming", "ready"})
"""A replica in these states is part of its model's fleet: routed to, or about to be."""
HEARTBEATING_STATES: frozenset[ReplicaState] = LIVE_REPLICA_STATES | {"draining"}
"""A replica in these states has a warmer that says so every heartbeat (`ReplicaHeartbeat`)."""


class _ReplicaEvent(Event, kw_only=True, frozen=True):
    """A replica's lifecycle, reported by the warmer that owns it; keyed by replica."""

    FAMILY = "lifecycle"
    STATE: ClassVar[ReplicaState] = "starting"

    replica: Name
    node: Name
    endpoint: OptionalName = ""
    kv_capacity_tokens: Tokens | None = None
    reason: Annotated[str, Meta(max_length=2048)] = ""


class ReplicaStarted(_ReplicaEvent, kw_only=True, frozen=True, tag="replica.started"):
    STATE = "starting"


class ReplicaWeightsLoaded(_ReplicaEvent, kw_only=True, frozen=True, tag="replica.weights_loaded"):
    STATE = "loading"


class ReplicaWarmingStarted(_ReplicaEvent, kw_only=True, frozen=True, tag="replica.warming_started"):
    STATE = "warming"


class ReplicaBecameReady(_ReplicaEvent, kw_only=True, frozen=True, tag="replica.became_ready"):
    STATE = "ready"


class ReplicaDrainingStarted(_ReplicaEvent, kw_only=True, frozen=True, tag="replica.draining_started"):
    STATE = "draining"


class ReplicaStopped(_ReplicaEvent, kw_only=True, frozen=True, tag="replica.stopped"):
    STATE = "gone"


class ReplicaCrashed(_ReplicaEvent, kw_only=True, frozen=True, tag="replica.crashed"):
    STATE = "failed"


class ReplicaLost(ReplicaStopped, kw_only=True, frozen=True, tag="replica.lost"):
    """The planner's word that a replica left without one (its node lost, its pod killed): its warmer's
    heartbeats stopped while the rest of the fleet's went on. A stop to every consumer; `reason` says
    since when it was silent."""


class ReplicaHeartbeat(Event, kw_only=True, frozen=True, tag="replica.heartbeat"):
    """A warmer's word that it still drives `replica`, in `state`: sent every heartbeat interval while the
    replica is in `HEARTBEATING_STATES`, keyed by replica, on a topic of its own (routers replay the
    lifecycle topic from its start, and would replay every heartbeat). Not a transition: it changes no
    state."""

    FAMILY = "heartbeat"

    replica: Name
    node: Name
    state: ReplicaState


class DeployStarted(Event, kw_only=True, frozen=True, tag="deploy.started"):
    """A rollout of `model` (with its new weights revision) and prompt revisions began."""

    FAMILY = "fleet"

    prompt_revs: list[OptionalName] = []


class DeployFinished(Event, kw_only=True, frozen=True, tag="deploy.finished"):
    FAMILY = "fleet"

    prompt_revs: list[OptionalName] = []


class FleetScaled(Event, kw_only=True, frozen=True, tag="fleet.scaled"):
    """The replica count of `model` changed from `from_replicas` to `to_replicas`."""

    FAMILY = "fleet"

    from_replicas: Tokens
    to_replicas: Tokens


class EpochBumped(Event, kw_only=True, frozen=True, tag="epoch.bumped"):
    """The cache epoch of (tenant, model) moved to `epoch`; every key and salt of the old one is dead."""

    FAMILY = "fleet"

    epoch: Epoch
    reason: Annotated[str, Meta(max_length=256)] = ""


class ReplicaRewarmRequested(Event, kw_only=True, frozen=True, tag="replica.rewarm_requested"):
    """Someone (`producer`) asked for `replica` to be warmed again in full: its cache is not what the
    records say (an engine restarted unnoticed, a cache flushed by hand)."""

    FAMILY = "fleet"

    replica: Name
    reason: Annotated[str, Meta(max_length=256)] = ""


class WarmItem(Struct, frozen=True, gc=False):
    """One prefix to pre-fill: its id, its tokens, the payload that renders it, and the namespace it
    belongs to: the tenant and its (tenant, model) `epoch` pick the `cache_salt` (a plan for a replica
    mixes tenants, each at its own epoch; `None` means the plan's epoch)."""

    prefix_id: PrefixId
    tokens: Tokens
    payload: PrefixPayload
    tenant: OptionalName = ""
    prompt_rev: OptionalName = ""
    epoch: Epoch | None = None

    def epoch_in(self, plan_epoch: int) -> int:
        """The epoch this item is warmed in, within a plan of `plan_epoch`."""
        return plan_epoch if self.epoch is None else self.epoch


class WarmPlanIssued(Event, kw_only=True, frozen=True, tag="warm_plan.issued"):
    """The planner asks the warmer of `node` to pre-fill `items` on `replica` before `deadline`."""

    FAMILY = "plan"

    plan_id: uuid.UUID
    replica: Name
    node: Name
    epoch: Epoch
    items: list[WarmItem]
    budget_tokens: Tokens
    deadline: AwareTime
    trigger_event_id: uuid.UUID | None = None
    """The `replica.started` event the plan answers, so a warmer drops one for an earlier start."""
    rewarm: bool = False
    """Warm every item, even those the warmer believes its replica holds (a requested re-warm)."""
    empty_reason: str | None = None
    """Why the plan is empty when the planner judged warming not worth it, one line ("warming buys little
    for model M: ..."); the replica turns ready at once."""


class WarmProgressed(Event, kw_only=True, frozen=True, tag="warm.progressed"):
    FAMILY = "warm_result"

    plan_id: uuid.UUID
    replica: Name
    items_done: Tokens
    items_total: Tokens
    tokens_prefilled: Tokens = 0


class WarmFinished(Event, kw_only=True, frozen=True, tag="warm.finished"):
    """The outcome of a plan: what was pre-filled, what a probe verified, what failed and why."""

    FAMILY = "warm_result"

    plan_id: uuid.UUID
    replica: Name
    items_done: Tokens
    tokens_prefilled: Tokens
    verified_hits: Tokens
    failures: list[Annotated[str, Meta(max_length=2048)]] = []
    partial: bool = False


class HeldPrefixes(Struct, array_like=True, frozen=True, gc=False):
    """Prefixes held in one cache namespace: a tenant's prompt revision at an epoch (compact on the wire:
    `[tenant, prompt_rev, epoch, [prefix ids]]`)."""

    tenant: OptionalName
    prompt_rev: OptionalName
    epoch: Epoch
    prefix_ids: Annotated[list[PrefixId], Meta(max_length=MAX_RESIDENT_PREFIXES)]

    def __post_init__(self) -> None:
        if "\x00" in f"{self.tenant}{self.prompt_rev}":
            raise ValueError("names must not contain NUL")


class ReplicaResidency(Event, kw_only=True, frozen=True, tag="replica.residency"):
    """What a replica holds of the prefixes its warmer warmed in its current start (`incarnation`, the id
    of that start's `replica.started`), read from the engine's KV cache events, as a whole: a later report
    replaces an earlier one. `lost` counts the prefixes warmed in this start that are no longer held
    (evicted, or the cache cleared). `complete` is false while the event stream has a gap the engine's
    replay could not fill and a probe has not yet settled: then `held` may miss prefixes still held."""

    FAMILY = "warm_result"

    replica: Name
    node: Name
    incarnation: uuid.UUID
    held: Annotated[list[HeldPrefixes], Meta(max_length=MAX_RESIDENT_PREFIXES)] = []
    lost: Tokens = 0
    complete: bool = True


AnyEvent = (
    RequestObserved
    | PrefixMissed
    | ReplicaStarted
    | ReplicaWeightsLoaded
    | ReplicaWarmingStarted
    | ReplicaBecameReady
    | ReplicaDrainingStarted
    | ReplicaStopped
    | ReplicaCrashed
    | ReplicaLost
    | ReplicaHeartbeat
    | DeployStarted
    | DeployFinished
    | FleetScaled
    | EpochBumped
    | ReplicaRewarmRequested
    | WarmPlanIssued
    | WarmProgressed
    | WarmFinished
    | ReplicaResidency
)
ReplicaEvent = _ReplicaEvent


def event_type(event: Event | type[Event]) -> str:
    """The contract's name for an event or an event class: its `type` tag."""
    return str(event.__struct_config__.tag)


EVENT_TYPES: dict[str, type[Event]] = {event_type(cls): cls for cls in AnyEvent.__args__}
"""Every event class by its `type` tag."""
