"""The planner's Prometheus metrics (`warmplane_planner_*`), registered on a registry the app owns."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from warmplane.shared.process_metrics import register_process_metrics

_START_WAY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
"""Seconds of a replica start's way to the planner, for its stages' histograms alike."""


class PlannerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.loop_tasks = register_process_metrics(registry, "planner")
        self.events = Counter(
            "warmplane_planner_events_ingested",
            "Events counted into Postgres, by type",
            ["type"],
            registry=registry,
        )
        self.duplicates = Counter(
            "warmplane_planner_duplicate_events",
            "Events skipped because their id was already counted",
            registry=registry,
        )
        self.dead_lettered = Counter(
            "warmplane_planner_dead_lettered",
            "Messages sent to the dead-letter topic, by reason class",
            ["reason"],
            registry=registry,
        )
        self.commit_failures = Counter(
            "warmplane_planner_offset_commit_failures",
            "Broker offset commits that failed (batch replays)",
            registry=registry,
        )
        self.db_retries = Counter(
            "warmplane_planner_db_retries",
            "Batch writes tried again because Postgres could not be reached",
            registry=registry,
        )
        self.plans_issued = Counter(
            "warmplane_planner_plans_issued",
            "Warm plans recorded and published",
            registry=registry,
        )
        self.plan_failures = Counter(
            "warmplane_planner_plan_failures",
            "Warm plans that could not be chosen, recorded or published",
            registry=registry,
        )
        self.statistics_reads = Counter(
            "warmplane_planner_statistics_reads",
            "Statistics plans were chosen from, by how they were had: read from Postgres, shared (a kept read"
            " begun after the start's batch), absorbed (a kept read brought up to date with the planner's"
            " own committed batches); and reads made again ahead of the plans they serve (refreshed)",
            ["how"],  # read, shared, absorbed, refreshed
            registry=registry,
        )
        self.empty_plans = Counter(
            "warmplane_planner_empty_plans",
            "Plans issued empty (or re-plans left out) because warming would buy too little, by reason",
            ["reason"],  # nothing_likely, little_saved, past_readiness_budget
            registry=registry,
        )
        self.epoch_bumps = Counter(
            "warmplane_planner_epoch_bumps",
            "Epochs the planner raised itself, by reason (deploy)",
            ["reason"],
            registry=registry,
        )
        self.cold_start_alarms = Counter(
            "warmplane_planner_cold_start_alarms",
            "Cold-start alarms fired (a model's requests too often found no cached prefix), by model",
            ["model"],
            registry=registry,
        )
        self.plan_outcomes = Counter(
            "warmplane_planner_plan_outcomes",
            "Plans' recorded outcomes (each plan's first warm.finished), counted once their batch committed",
            ["outcome"],  # verified, partial, failed
            registry=registry,
        )
        for outcome in ("verified", "partial", "failed"):
            self.plan_outcomes.labels(outcome)  # at 0 from the start: increase() misses a series' first step
        self.replica_liveness = Counter(
            "warmplane_planner_replica_liveness",
            "Replicas announced lost (their heartbeats stopped while the fleet's went on), and back",
            ["change"],  # lost, returned
            registry=registry,
        )
        for change in ("lost", "returned"):
            self.replica_liveness.labels(change)
        self.consumer_lag = Gauge(
            "warmplane_planner_consumer_lag",
            "Events on each assigned partition not yet read (log end offset minus position)",
            ["topic", "partition"],
            registry=registry,
        )
        self.batch_seconds = Histogram(
            "warmplane_planner_batch_write_seconds",
            "Time to write one batch to Postgres",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=registry,
        )

        self.planning_waiting = Gauge(
            "warmplane_planner_planning_waiting",
            "Triggers waiting for the planning task (at most one a key: they coalesce)",
            registry=registry,
        )
        self.ingest_yielded_seconds = Counter(
            "warmplane_planner_ingest_yielded_seconds",
            "Time ingestion paused before a batch while a plan someone waits for was made (planning.py)",
            registry=registry,
        )
        self.planning_queued_seconds = Histogram(
            "warmplane_planner_planning_queued_seconds",
            "Time a trigger waited for the planning task, from its first put to its handling, by type",
            ["trigger"],
            buckets=(0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.start_ingested_seconds = Histogram(
            "warmplane_planner_start_ingested_seconds",
            "Time from a replica.started event (its occurred_at, the producer's clock) to the commit of the"
            " batch that counted it",
            buckets=_START_WAY_BUCKETS,
            registry=registry,
        )
        self.start_delivered_seconds = Histogram(
            "warmplane_planner_start_delivered_seconds",
            "Time from a replica.started event (its occurred_at, the producer's clock) to its decoding in the"
            " consumer's handler: the share of start_ingested_seconds spent before the ingestor held it",
            buckets=_START_WAY_BUCKETS,
            registry=registry,
        )
        self.planning_seconds = Histogram(
            "warmplane_planner_planning_seconds",
            "Time the planning task took over one trigger, by trigger type",
            ["trigger"],
            buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )

    def events_ingested(self, event_type: str | None = None) -> int:
        """Events counted into Postgres so far, of `event_type` or of all types (for in-process progress)."""
        return int(
            sum(
                sample.value
                for metric in self.events.collect()
                for sample in metric.samples
                if sample.name.endswith("_total") and event_type in (None, sample.labels["type"])
            )
        )
