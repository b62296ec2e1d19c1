"""The planner's settings: `WARMPLANE_INGEST__*` and `WARMPLANE_PLANS__*` on top of the shared parts."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from warmplane.shared.settings import WarmplaneSettings

Positive = Annotated[int, Field(gt=0)]
Hours = Annotated[float, Field(gt=0)]


class IngestSettings(BaseModel):
    """How the planner consumes and folds events."""

    group_id: str = Field("warmplane-planner", min_length=1)
    batch_max_records: Positive = 10_000
    batch_timeout_ms: Positive = 100
    fetch_max_wait_ms: Positive = 50
    """How long the broker may hold a fetch with nothing to return: bounds how late a lifecycle event is
    seen (and so a starting replica's plan) when traffic is quiet."""
    max_partition_fetch_bytes: Positive = 4 * 1024 * 1024
    bucket_seconds: Annotated[int, Field(ge=1, le=86_400)] = 60
    ledger_retention_hours: Hours = 24.0
    dedup_window_per_partition: Annotated[int, Field(ge=1_000)] = 20_000
    """How many recent event ids per partition are checked for a producer's retried duplicates."""
    catalog_retention_hours: Hours = 24.0 * 7
    catalog_max_payload_bytes: Positive = 64 * 1024
    sweep_interval_s: Annotated[float, Field(gt=0)] = 300.0
    node_cache_size: Annotated[int, Field(ge=2)] = 1_000_000
    writer_queue_depth: Positive = 4


class PlanSettings(BaseModel):
    """How the planner chooses a starting replica's warm plan (the simple policy)."""

    budget_tokens: Annotated[int, Field(gt=0, le=2**31 - 1)] = 200_000
    """The most tokens a plan's items add up to."""
    max_items: Annotated[int, Field(gt=0, le=100_000)] = 256
    deadline_s: Annotated[float, Field(gt=0)] = 120.0
    """How long after issuing the warmer has to carry the plan out."""
    window_hours: Hours = 24.0
    """How far back request counts make a prefix popular."""
    catch_up_interval_s: Annotated[float, Field(gt=0)] = 10.0
    """How often unpublished plans are published again and unplanned starts planned."""
    catch_up_grace_s: Annotated[float, Field(gt=0)] = 5.0
    """Only plans and starts older than this are caught up: younger ones are still being handled."""
    catch_up_window_s: Annotated[float, Field(gt=0)] = 900.0
    """Starts older than this are not planned any more (their warmer has turned ready cold by then)."""


class PlannerSettings(WarmplaneSettings):
    ingest: IngestSettings = IngestSettings()
    plans: PlanSettings = PlanSettings()
    metrics_port: Annotated[int, Field(ge=0, le=65_535)] = 9464
    """Port of the Prometheus endpoint; 0 turns it off."""
