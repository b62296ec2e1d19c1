"""The API's Prometheus metrics (`warmplane_api_*`), on a registry of its own.

Beside its own requests, the API exports the seed documents' health figures per tenant and model, read
from the planner's statistics every `health_refresh_s`: the prefix hit ratio (cached ÷ prompt tokens)
and the cold-start count and ratio over the last five minutes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from warmplane.shared.process_metrics import register_process_metrics

HEALTH_WINDOW_S = 300


class ApiMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.loop_tasks = register_process_metrics(self.registry, "api")
        self.requests = Counter(
            "warmplane_api_requests",
            "API requests answered, by route template and status code",
            ["route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "warmplane_api_request_seconds",
            "Time to answer an API request",
            ["route"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        )
        self.actions = Counter(
            "warmplane_api_actions",
            "Admin actions published, by type",
            ["type"],
            registry=self.registry,
        )
        self.prefix_hit_ratio = Gauge(
            "warmplane_api_prefix_hit_ratio",
            "Cached ÷ prompt tokens over the last five minutes, per tenant and model",
            ["tenant", "model"],
            registry=self.registry,
        )
        self.cold_requests = Gauge(
            "warmplane_api_cold_requests",
            "Requests with no cached prefix over the last five minutes, per tenant and model",
            ["tenant", "model"],
            registry=self.registry,
        )
        self.cold_start_ratio = Gauge(
            "warmplane_api_cold_start_ratio",
            "Requests with no cached prefix ÷ requests over the last five minutes, per tenant and model",
            ["tenant", "model"],
            registry=self.registry,
        )
        self.health_refresh_failures = Counter(
            "warmplane_api_health_refresh_failures",
            "Times the health gauges could not be read from Postgres",
            registry=self.registry,
        )
