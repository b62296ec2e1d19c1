"""The warmer's Prometheus metrics (`warmplane_warmer_*`), on a registry the warmer owns."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from warmplane.shared.process_metrics import register_process_metrics


class WarmerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.loop_tasks = register_process_metrics(registry, "warmer")
        self.plans = Counter(
            "warmplane_warmer_plans",
            "Plans read off the plans topic, by what became of them",
            ["outcome"],  # accepted, duplicate, dropped, other_node, unknown_replica
            registry=registry,
        )
        self.items = Counter(
            "warmplane_warmer_items",
            "Plan items finished, by final state",
            ["replica", "state"],  # verified, unverified, failed, too_short, held
            registry=registry,
        )
        self.tokens_prefilled = Counter(
            "warmplane_warmer_tokens_prefilled",
            "Prompt tokens the engines computed for warm-ups (prompt minus cached)",
            ["replica"],
            registry=registry,
        )
        self.ready = Gauge(
            "warmplane_warmer_replica_ready",
            "1 when the replica's /ready is true",
            ["replica"],
            registry=registry,
        )
        self.partial = Gauge(
            "warmplane_warmer_replica_partial",
            "1 when the replica turned ready without its warm verified (deadline or no plan)",
            ["replica"],
            registry=registry,
        )
        self.crashes = Counter(
            "warmplane_warmer_replica_crashes",
            "Times an engine that answered stopped answering",
            ["replica"],
            registry=registry,
        )
        self.plan_seconds = Histogram(
            "warmplane_warmer_plan_seconds",
            "Wall time of a plan run, warm and probe passes",
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=registry,
        )
        self.time_to_ready = Histogram(
            "warmplane_warmer_time_to_ready_seconds",
            "From an incarnation's start to ready",
            buckets=(1, 5, 10, 30, 60, 120, 300, 600, 1800),
            registry=registry,
        )
        self.plan_latency = Histogram(
            "warmplane_warmer_plan_latency_seconds",
            "From announcing a replica's start to holding the plan the planner issued for it",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.dead_lettered = Counter(
            "warmplane_warmer_dead_lettered",
            "Messages on the plans topic that did not decode, sent to the dead-letter topic",
            ["reason"],
            registry=registry,
        )
        self.consumer_lag = Gauge(
            "warmplane_warmer_consumer_lag",
            "Plans on each partition of the plans topic not yet read (log end offset minus position)",
            ["topic", "partition"],
            registry=registry,
        )
        self.resident = Gauge(
            "warmplane_warmer_resident_prefixes",
            "Warmed prefixes of the replica's current start its engine's KV events say it still holds",
            ["replica"],
            registry=registry,
        )
        self.lost = Gauge(
            "warmplane_warmer_lost_prefixes",
            "Warmed prefixes of the replica's current start no longer held (evicted, or the cache cleared)",
            ["replica"],
            registry=registry,
        )
        self.residency_complete = Gauge(
            "warmplane_warmer_residency_complete",
            "0 while lost KV events leave some held prefix unsure (until a probe settles it), else 1",
            ["replica"],
            registry=registry,
        )
        self.outbox = Gauge(
            "warmplane_warmer_outbox_events",
            "Lifecycle events, warm results and heartbeats waiting for the broker's acknowledgement",
            registry=registry,
        )
        self.publish_retries = Counter(
            "warmplane_warmer_publish_retries",
            "Lifecycle or result events the broker did not acknowledge in time (retried)",
            registry=registry,
        )

    def add_replica(self, replica: str) -> None:
        """Create `replica`'s failure counter at 0: Prometheus' increase() cannot see a series' first
        step, so a replica whose first plan failed would never raise the warm-failure alert."""
        self.items.labels(replica, "failed")
