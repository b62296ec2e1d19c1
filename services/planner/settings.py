"""The planner's settings: `WARMPLANE_INGEST__*` and `WARMPLANE_PLANS__*` on top of the shared parts."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, Field, model_validator

from warmplane.services.planner.policy import PolicyKnobs
from warmplane.shared.settings import DatabaseSettings, HeartbeatSettings, RingSettings, StatisticsSettings

_KNOBS = PolicyKnobs()
"""The policy's defaults, which the trace evaluator measures too."""

Positive = Annotated[int, Field(gt=0)]
Hours = Annotated[float, Field(gt=0)]


class IngestSettings(BaseModel):
    """How the planner consumes and folds events."""

    group_id: str = Field("warmplane-planner", min_length=1)
    """Planners in one group share the partitions. The lifecycle topic is read in a group of its own,
    `<group_id>-lifecycle`, so a replica's start is not fetched behind request batches."""
    batch_max_records: Positive = 30_000
    """Events a batch holds at most: one transaction each. Under load, fewer and larger transactions
    leave more of the planner's CPU to decoding (bench/ingest_bench.py: 30,000 with two queued against
    10,000 with four, about 8% more events/s in one process, and 4 to 15% in two in two sets of runs);
    at a quiet time a batch holds what one fetch brings."""
    batch_timeout_ms: Positive = 100
    """How long a batch waits to fill before it is folded with what it holds."""
    max_partition_fetch_bytes: Positive = 4 * 1024 * 1024
    """Most bytes one fetch brings from one partition."""
    ledger_retention_hours: Hours = 24.0
    """How long consumed event ids are kept to refuse a duplicate that comes late."""
    dedup_window_per_partition: Annotated[int, Field(ge=1_000)] = 20_000
    """How many recent event ids per partition are checked for a producer's retried duplicates."""
    catalog_retention_hours: Hours = 24.0 * 7
    """Payloads not seen for this long are dropped."""
    stats_retention_hours: Hours = 24.0 * 31
    """How long request sums per scope, miss sums and per-replica sums are kept (by their bucket's time):
    the API's longest window is 30 days."""
    detail_retention_hours: Hours = 25.0
    """How long request counts per prefix, and the chains they reach, are kept; older buckets are summed
    per scope (`pg_retention`). At least the plans' `WARMPLANE_PLANS__WINDOW_HOURS` (24 h, and an
    hour for a sweep's lag) and at most `stats_retention_hours`: a plan reads every chain this keeps, so
    it bounds a plan's read (`python -m bench.statistics_read_bench`). The API's warm-set coverage counts
    requests of this window at most."""
    history_retention_hours: Hours = 24.0 * 7
    """How long gone replicas and earlier incarnations' plans and transitions are kept (`pg_retention`):
    a replica's latest start and its current plans stay whatever their age."""
    catalog_max_payload_bytes: Positive = 64 * 1024
    """Larger prefix payloads are dead-lettered."""
    sweep_interval_s: Annotated[float, Field(gt=0)] = 300.0
    """How often retention sweeps run (catalog, statistics, history)."""
    node_cache_size: Annotated[int, Field(ge=2)] = 1_000_000
    """Chain nodes a planner remembers as written (emptied whole when full)."""
    node_cache_max_age_s: Annotated[float, Field(gt=0)] = 3600.0
    """The planner forgets which chain nodes it wrote once the oldest it remembers is this old, so it never
    anchors new nodes at a chain row the retention sweep may have deleted: the sweep keeps chain rows twice
    this long past the detail cut (`core/node_cache.py` says why)."""
    db_outage_s: Annotated[float, Field(ge=0, le=240)] = 120.0
    """How long the writer rides out an unreachable Postgres (a restart, a failover), trying its batch
    again, before it stops the planner. At most 240 s: the consumer, blocked meanwhile, must poll again
    within the broker's 300 s `max.poll.interval.ms`."""
    writer_queue_depth: Positive = 2
    """Decoded batches waiting for the writer: with the one being written and the one being decoded,
    what bounds the planner's memory (a 30,000-event batch of the bench's fleet shape holds 12 MB of
    records and 31 MB of decoded events: about 180 MB at most, as 10,000 with four queued held 90)."""

    @model_validator(mode="after")
    def _node_cache_forgets_well_inside_the_retention(self) -> Self:
        if 2 * self.node_cache_max_age_s > 3600 * self.detail_retention_hours:
            raise ValueError(
                f"node_cache_max_age_s ({self.node_cache_max_age_s:g}) is more than half of "
                f"detail_retention_hours ({self.detail_retention_hours:g} h): swept chains could stay cached"
            )
        if self.detail_retention_hours > self.stats_retention_hours:
            raise ValueError(
                f"detail_retention_hours ({self.detail_retention_hours:g}) is longer than "
                f"stats_retention_hours ({self.stats_retention_hours:g}): the sums per scope would go first"
            )
        return self


class PlanSettings(BaseModel):
    """How the planner chooses a replica's warm plan (`policy.choose_for_replicas`)."""

    budget_tokens: Annotated[int, Field(gt=0, le=2**31 - 1)] = 200_000
    """The most prefill tokens a plan may cost (further capped by the replica's KV capacity and the
    prefill budget in seconds)."""
    warm_seconds: Annotated[float, Field(gt=0)] | None = None
    """When set with `prefill_tokens_per_s`: the most seconds of prefill a plan may cost."""
    prefill_tokens_per_s: Annotated[float, Field(gt=0)] | None = None
    """The replicas' measured prefill rate, tokens per second."""
    capacity_fraction: Annotated[float, Field(gt=0, le=1)] = _KNOBS.capacity_fraction
    """A plan costs at most this share of the replica's KV capacity (`replicas.kv_capacity_tokens`)."""
    half_life_s: Annotated[float, Field(gt=0)] = _KNOBS.half_life_s
    """Request counts lose half their weight in this long: the recency estimate of a prefix's rate."""
    frequency_half_life_s: Annotated[float, Field(gt=0)] | None = _KNOBS.frequency_half_life_s
    """The same counts at this longer half-life: the frequency estimate. A rate is the mean of the two
    (conversations reward recency, shared documents frequency); None uses `half_life_s` alone."""
    ramp_window_s: Annotated[float, Field(gt=0)] = _KNOBS.ramp_window_s
    """A warm block pays when it is used at least once in this long after the replica starts."""
    min_reuse_probability: Annotated[float, Field(ge=0, le=1)] = _KNOBS.min_reuse_probability
    """Blocks less likely than this to be used in the ramp window (calibrated on the model's own history:
    `policy.fit_calibration`) are not warmed for themselves: the least expected saved prefill per warmed
    token. The policy's one spend knob (measured: `python -m bench.evaluate_policy`, which sweeps it)."""
    min_expected_saved_tokens: Annotated[int, Field(ge=0)] = _KNOBS.min_expected_saved_tokens
    """A plan whose expected saved prefill (each item's tokens times its calibrated chance of reuse) is
    below this is issued empty, with its reason, and the replica turns ready at once: a plan holds
    readiness back whatever its size. So is one that would take longer than `deadline_s` at
    `prefill_tokens_per_s` (when that is known)."""
    max_items: Annotated[int, Field(gt=0, le=100_000)] = 256
    """Prefixes a plan holds at most."""
    deadline_s: Annotated[float, Field(gt=0)] = 120.0
    """How long after issuing the warmer has to carry the plan out."""
    window_hours: Hours = 24.0
    """How far back request counts are read at most. A read also stops at the weight horizon, 12 of the
    longest half-life (`policy.weight_horizon_s`: 2 hours at the defaults), past which counts weigh under
    2 ** -12: reading 24 hours would read ten times the buckets for the same plans."""
    max_nodes: Annotated[int, Field(ge=1)] | None = 1_000_000
    """Chain nodes a plan's read holds at most: the leaves most recently counted whose chains fit. A kept
    read that outgrows it by absorbing reads again, and kept reads together hold at most this many beside
    the newest (`kept_reads.py`). So what the planner holds for plans is bounded by this, not by the history
    or the traffic rate (`python -m bench.statistics_read_bench --max-nodes` measures a read's memory
    within it). Size it near the fleet's KV capacity in blocks: a store of
    0.8 of it planned as one holding everything on the shipped traces (`python -m bench.store_eval`). None
    holds every counted leaf."""
    statistics_max_age_s: Annotated[float, Field(ge=0, le=300)] = 10.0
    """Plans of starting replicas chosen within this long of one read of a model's counts share it (a
    rolling deploy starts replica after replica; each read builds the model's trie), if the read began
    after their starts' batches committed; counts younger than the read wait for the next. Re-plans (a
    bump, an alarm, a fleet change) always read, unless a read absorbs (`statistics_live_s`). 0 reads for
    every plan."""
    statistics_live_s: Annotated[float, Field(ge=0, le=3_600)] = 60.0
    """While this planner counts every request of the traffic topics (it owns all their partitions), a read
    of a model's counts absorbs the batches it commits afterwards (`core/absorbed_counts.py`) and serves
    every plan for this long, re-plans included: it holds what a read would, without the read and the trie
    build that dominate a start's plan under load. In the last quarter of this it is read again beside the
    planning task, and a plan meanwhile takes the read being replaced: no plan waits for it. 0 never
    absorbs."""
    calibration_max_age_s: Annotated[float, Field(ge=0, le=3_600)] = 60.0
    """A model's map from score to observed reuse (`policy.fit_calibration`), fitted at a read of its
    counts, serves the reads within this long after it: it describes how the model's traffic reuses
    prefixes, which moves over minutes, and refitting it at every read was a large share of a start's trie
    build (`python -m bench.plan_latency_bench`). 0 fits at every read."""
    planning_queue_depth: Annotated[int, Field(gt=0, le=1_000_000)] = 1_024
    """Triggers (`core/triggers.py`) waiting for the planning task at most. They coalesce, one a key (model,
    tenant and model, replica, deploy), so this bounds distinct keys, not traffic; when it is reached the
    ingest writer waits for room (`planning.py`)."""
    ingest_yield_s: Annotated[float, Field(ge=0, le=10)] = 0.5
    """Before each batch, ingestion pauses while a plan a replica or a tenant waits for is made (a start, a
    re-warm, a bump, a deploy, a re-plan of ready replicas), for at most this long, then runs at least as long
    as it paused (`planning.py`). Under load a start's plan otherwise shares the event loop, the CPU and
    Postgres with ingestion. 0 never pauses."""
    planning_drain_s: Annotated[float, Field(ge=0, le=120)] = 10.0
    """At shutdown, how long the planning task may go on handling what waits once ingestion has drained;
    what is left then is the catch-up's (starts) or lost (re-plans of running replicas)."""
    catch_up_interval_s: Annotated[float, Field(gt=0)] = 10.0
    """How often unpublished plans are published again and unplanned starts planned."""
    catch_up_grace_s: Annotated[float, Field(gt=0)] = 5.0
    """Only plans and starts older than this are caught up: younger ones are still being handled."""
    catch_up_window_s: Annotated[float, Field(gt=0)] = 900.0
    """Starts older than this are not planned any more (their warmer has turned ready cold by then)."""

    @model_validator(mode="after")
    def _seconds_need_a_rate(self) -> Self:
        if (self.warm_seconds is None) != (self.prefill_tokens_per_s is None):
            raise ValueError("warm_seconds and prefill_tokens_per_s are set together or not at all")
        return self

    @model_validator(mode="after")
    def _frequency_is_the_longer_half_life(self) -> Self:
        if self.frequency_half_life_s is not None and not self.frequency_half_life_s > self.half_life_s:
            raise ValueError(
                f"frequency_half_life_s ({self.frequency_half_life_s:g}) must be longer than half_life_s"
                f" ({self.half_life_s:g})"
            )
        return self


class PlanRingSettings(RingSettings):
    """The gateway's ring (`RingSettings`, the variables the gateway reads): which replica a prefix is
    routed to decides which replica's plan it belongs in; and whether requests are routed by it at all."""

    mode: Literal["ring", "spread"] = "ring"
    """`ring`: requests are routed by Warmplane's gateway (or a router keyed as it is), so each replica is
    planned for the prefixes its share of the ring sends it. `spread`: the team's own router (vllm-router,
    production-stack, llm-d, round robin) decides, so each replica is planned for its weight share of every
    prefix's traffic: the fleet's most reused prefixes, alike on every replica. The planner's alone."""


class ColdStartSettings(BaseModel):
    """The cold-start alarm: a model whose requests find no cached prefix too often has its live replicas'
    warm sets planned again. Judged on event time, per statistics bucket."""

    enabled: bool = True
    """Off, nothing is planned again for a model whose traffic looks cold."""
    alarm_ratio: Annotated[float, Field(gt=0, le=1)] = 0.3
    """A bucket is cold when more than this share of its requests found nothing cached."""
    sustain_s: Annotated[float, Field(gt=0)] = 300.0
    """The alarm fires when every bucket of this long (ending at the latest one seen) is cold."""
    clear_ratio: Annotated[float, Field(ge=0, le=1)] = 0.2
    """An alarm clears (and may fire again) once a bucket's ratio is at or below this."""
    min_requests: Annotated[int, Field(ge=1)] = 5
    """Buckets with fewer requests than this say nothing either way."""

    @model_validator(mode="after")
    def _hysteresis(self) -> Self:
        if self.clear_ratio > self.alarm_ratio:
            raise ValueError("clear_ratio must not exceed alarm_ratio")
        return self


class PlannerSettings(DatabaseSettings):
    ingest: IngestSettings = IngestSettings()
    plans: PlanSettings = PlanSettings()
    routing: PlanRingSettings = PlanRingSettings()
    statistics: StatisticsSettings = StatisticsSettings()
    cold_start: ColdStartSettings = ColdStartSettings()
    heartbeat: HeartbeatSettings = HeartbeatSettings()
    metrics_port: Annotated[int, Field(ge=0, le=65_535)] = 9464
    """Port of the Prometheus endpoint; 0 turns it off."""

    @model_validator(mode="after")
    def _statistics_outlive_the_plans_window(self) -> Self:
        if self.ingest.detail_retention_hours < self.plans.window_hours:
            raise ValueError(
                f"ingest.detail_retention_hours ({self.ingest.detail_retention_hours:g}) is shorter than "
                f"plans.window_hours ({self.plans.window_hours:g}): plans would read swept statistics"
            )
        return self
