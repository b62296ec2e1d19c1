"""The API's request bodies and answers: what the OpenAPI document publishes and responses are checked
against."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from warmplane.services.api import figures
from warmplane.shared.events import ReplicaState
from warmplane.shared.plan_states import PlanState

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00]+$")]
OptionalName = Annotated[str, Field(max_length=128, pattern=r"^[^\x00]*$")]


def _json_integer(value: Any) -> Any:
    """A JSON number that is whole (3 or 3.0), not a boolean or a string holding digits: what JSON
    Schema's `integer` admits, so the published document and the validation agree."""
    if isinstance(value, bool | str):
        raise ValueError("must be a JSON integer")
    return value


Replicas = Annotated[int, Field(ge=0, le=100_000), BeforeValidator(_json_integer)]


class Problem(BaseModel):
    """Every error answer: what is wrong, in one sentence."""

    error: str


class PlanSummary(BaseModel):
    plan_id: uuid.UUID
    state: PlanState
    epoch: int
    items: int
    items_done: int | None
    verified_hits: int | None
    tokens_prefilled: int | None
    issued_at: datetime
    deadline: datetime
    finished_at: datetime | None


class TrafficFigures(BaseModel):
    """Sums of request events and the ratios read from them (null where nothing was counted)."""

    requests: int
    cold_requests: int = Field(description="requests that found no cached prefix")
    prompt_tokens: int
    cached_tokens: int
    prefix_hit_ratio: float | None = Field(description="cached ÷ prompt tokens; null without traffic")
    cold_start_ratio: float | None = Field(description="cold requests ÷ requests; null without traffic")
    mean_ttft_ms: float | None

    @staticmethod
    def from_sums(sums: Sequence[Any]) -> dict[str, Any]:
        """The fields of a `TrafficFigures` (or a subclass) from the statistics tables' sums, in the
        order requests, cold requests, prompt tokens, cached tokens, TTFT sum (ms), TTFT count."""
        requests, cold, prompt, cached, ttft_sum, ttft_count = sums
        return {
            "requests": requests,
            "cold_requests": cold,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "prefix_hit_ratio": figures.ratio(cached, prompt),
            "cold_start_ratio": figures.ratio(cold, requests),
            "mean_ttft_ms": figures.ratio(ttft_sum, ttft_count),
        }


class ReplicaHits(TrafficFigures):
    """The requests a replica served in the window (request events' `replica`). For a tenant token,
    or a `tenant` asked for, only that tenant's requests count."""

    since: datetime = Field(description="start of the window's first statistics bucket")


class Replica(BaseModel):
    replica: str
    node: str
    model: str
    model_revision: str
    endpoint: str
    state: ReplicaState
    state_since: datetime
    reason: str
    kv_capacity_tokens: int | None
    latest_plan: PlanSummary | None
    hits: ReplicaHits


class Transition(BaseModel):
    state: str
    occurred_at: datetime
    reason: str


class HeldNamespace(BaseModel):
    tenant: str
    prompt_rev: str
    epoch: int
    prefixes: int = Field(description="prefixes held in this tenant's prompt revision at this epoch")


class Residency(BaseModel):
    """What the replica holds of the prefixes its warmer warmed since its current start, by the warmer's
    latest report (read from the engine's KV cache events). Counts only, never prefix ids."""

    held: int = Field(description="prefixes held; for a tenant-scoped read, only that tenant's")
    lost: int | None = Field(
        description="warmed prefixes no longer held, over every tenant: null for a tenant-scoped read"
    )
    complete: bool = Field(description="false: the report may leave out prefixes still held")
    reported_at: datetime = Field(description="when the warmer made the report (its clock)")
    by_tenant: list[HeldNamespace]


class ReplicaDetail(Replica):
    transitions: list[Transition]
    residency: Residency | None = Field(description="null until the warmer reports on the current start")


class Plan(BaseModel):
    plan_id: uuid.UUID
    replica: str
    node: str
    model: str
    epoch: int
    state: PlanState
    items: int
    budget_tokens: int
    issued_at: datetime
    published_at: datetime | None
    deadline: datetime
    items_done: int | None
    tokens_prefilled: int | None
    verified_hits: int | None
    failures: int
    empty_reason: str | None = Field(
        None, description="why the plan is empty, when the planner judged warming not worth it"
    )
    finished_at: datetime | None
    trigger_event_id: uuid.UUID | None


class PlanItem(BaseModel):
    prefix_id: int
    tokens: int
    tenant: str
    prompt_rev: str
    epoch: int
    preview: str | None = Field(None, description="the payload's start; only for admin tokens")


class PlanDetail(Plan):
    item_list: list[PlanItem]
    failure_list: list[Any]


class Epoch(BaseModel):
    tenant: str
    model: str
    epoch: int
    bumped_at: datetime | None
    reason: str


class FleetChange(BaseModel):
    event_id: uuid.UUID
    type: str
    occurred_at: datetime
    revision: str
    epoch: int | None
    reason: str


class EpochDetail(Epoch):
    history: list[FleetChange]


class Miss(BaseModel):
    tenant: str
    model: str
    prompt_rev: str
    prefix_id: int
    misses: int
    missed_tokens: int
    tokens: int | None = Field(None, description="the prefix's length, when its payload is catalogued")
    preview: str | None = Field(None, description="only for admins and the tenant's own tokens")


class TrafficPoint(TrafficFigures):
    start: datetime
    tenant: str
    model: str


class WarmSet(BaseModel):
    tenant: str
    model: str
    prompt_rev: str
    epoch: int
    prefixes: int
    tokens: int
    replicas: list[str]
    verified_replicas: list[str] = Field(description="replicas whose plan with this set was verified")
    requests_covered: int = Field(description="requests in the window whose chain passes a warm prefix")
    requests: int
    coverage: float | None


class Accepted(BaseModel):
    """An admin action was published; the planner acts on it asynchronously."""

    event_id: uuid.UUID
    type: str
    epoch: int | None = None


class BumpEpoch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(max_length=256)] = ""


class AnnounceDeploy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    phase: Literal["started", "finished"]
    tenant: OptionalName = Field("", description="empty: the deploy concerns every tenant of the model")
    model: Name
    revision: OptionalName = Field("", description="the weights revision being rolled out")
    prompt_revs: Annotated[list[OptionalName], Field(max_length=64)] = []


class RewarmReplica(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replica: Name
    reason: Annotated[str, Field(max_length=256)] = ""


class AnnounceScale(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: OptionalName = ""
    model: Name
    revision: OptionalName = ""
    from_replicas: Replicas
    to_replicas: Replicas
