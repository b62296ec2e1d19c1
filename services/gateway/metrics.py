"""The gateway's Prometheus metrics (`warmplane_gateway_*`), on a registry the gateway owns.

Labels stay bounded: `tenant` is a configured tenant or `-` (unauthenticated), `model` a served model
or `-` (unknown to the gateway), `replica` a member of the fleet. The cached-token ratio is
`rate(warmplane_gateway_cached_tokens_total) / rate(warmplane_gateway_prompt_tokens_total)`, and a
per-request histogram of it. The result cache's hit rate (the seed documents' "semantic hit rate") is
`sum(rate(warmplane_gateway_result_lookups_total{outcome=~"l1|exact|semantic|flight"})) /
sum(rate(warmplane_gateway_result_lookups_total))` per tenant and model.

The serving path takes labelled children from `pair(tenant, model)` and `replica(name)`, which resolve
them once per label set: `labels()` costs about 5 us a call, and a request made seven of them. The
memo is as bounded as the labels themselves.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from warmplane.shared.process_metrics import register_process_metrics

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_RATIO = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.loop_tasks = register_process_metrics(registry, "gateway")
        tm = ["tenant", "model"]
        self.requests = Counter(
            "warmplane_gateway_requests",
            "Requests answered, by endpoint and HTTP status",
            [*tm, "endpoint", "status"],
            registry=registry,
        )
        self.errors = Counter(
            "warmplane_gateway_errors",
            "Requests that failed, by error code (OpenAI `code`, or the replica's status)",
            [*tm, "code"],
            registry=registry,
        )
        self.latency = Histogram(
            "warmplane_gateway_request_seconds",
            "From the request's arrival to the answer's last byte",
            tm,
            buckets=_SECONDS,
            registry=registry,
        )
        self.ttft = Histogram(
            "warmplane_gateway_ttft_seconds",
            "Streaming: from the request's arrival to its first byte out",
            tm,
            buckets=_SECONDS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "warmplane_gateway_prompt_tokens", "Prompt tokens, from the engine's usage", tm, registry=registry
        )
        self.cached_tokens = Counter(
            "warmplane_gateway_cached_tokens",
            "Prompt tokens the engine found in its prefix cache",
            tm,
            registry=registry,
        )
        self.cached_ratio = Histogram(
            "warmplane_gateway_cached_ratio",
            "Per request: cached tokens over prompt tokens",
            tm,
            buckets=_RATIO,
            registry=registry,
        )
        self.cold = Counter(
            "warmplane_gateway_cold_requests",
            "Requests whose leading prefix was not resident (a prefix.missed was emitted)",
            tm,
            registry=registry,
        )
        self.failovers = Counter(
            "warmplane_gateway_failovers",
            "Connection failures that moved a request to the next replica",
            ["replica"],
            registry=registry,
        )
        self.resends = Counter(
            "warmplane_gateway_resends",
            "Requests sent to a replica once more, on a new connection, after it closed a kept-alive one"
            " without answering (its idle timeout crossed the request)",
            ["replica"],
            registry=registry,
        )
        self.ejections = Counter(
            "warmplane_gateway_ejections",
            "Times a replica was left out of the ring after a failure",
            ["replica", "reason"],  # connect, mid_stream, protocol
            registry=registry,
        )
        self.in_flight = Gauge(
            "warmplane_gateway_in_flight", "Requests in flight per replica", ["replica"], registry=registry
        )
        self.result_lookups = Counter(
            "warmplane_gateway_result_lookups",
            "Result-cache lookups by outcome: l1 (memory), exact (Redis), semantic (pgvector), flight (an"
            " identical request's answer, single flight) are hits; miss, error (served by a replica)",
            [*tm, "outcome"],
            registry=registry,
        )
        self.result_purged = Counter(
            "warmplane_gateway_result_purged",
            "Answers deleted from Redis in the background after an epoch bump made them unreachable",
            ["model"],
            registry=registry,
        )
        self.result_warmed = Counter(
            "warmplane_gateway_result_warmed",
            "Answers held in L1 by warming: the most asked of the last 24 hours, at start and after a bump",
            ["model"],
            registry=registry,
        )
        self.result_embedding_failures = Counter(
            "warmplane_gateway_result_embedding_failures",
            "Queries whose embedding failed (error) or took longer than the embedding timeout (timeout):"
            " the semantic tier was skipped for them",
            ["model", "reason"],
            registry=registry,
        )
        self.result_bypass = Counter(
            "warmplane_gateway_result_bypass",
            "Requests the result cache stayed out of: streaming, sampling, choices, no_store, no_user"
            " (scoped by user, none named); no_cache (looked up nothing, the answer is kept)",
            [*tm, "reason"],
            registry=registry,
        )
        self.result_keeps = Counter(
            "warmplane_gateway_result_keeps",
            "Answers offered to the result cache: kept, too_large, dropped (too many pending), error",
            ["model", "outcome"],
            registry=registry,
        )
        self.result_corrupt = Counter(
            "warmplane_gateway_result_corrupt",
            "Stored answers that were not intact (cut short, or not written by the gateway): deleted,"
            " never served",
            ["model"],
            registry=registry,
        )
        self.events_dropped = Counter(
            "warmplane_gateway_events_dropped",
            "Events the emitter refused (its buffer full or closed): never waited for",
            registry=registry,
        )

        self._pairs: dict[tuple[str, str], PairMetrics] = {}
        self._in_flight: dict[str, Gauge] = {}

    def pair(self, tenant: str, model: str) -> PairMetrics:
        """The children labelled (tenant, model), made on first use."""
        found = self._pairs.get((tenant, model))
        if found is None:
            found = self._pairs[(tenant, model)] = PairMetrics(self, tenant, model)
        return found

    def in_flight_of(self, replica: str) -> Gauge:
        """The in-flight gauge of `replica`."""
        found = self._in_flight.get(replica)
        if found is None:
            found = self._in_flight[replica] = self.in_flight.labels(replica)
        return found


class PairMetrics:
    """The labelled children of one (tenant, model); `requests` and `errors` memoise theirs too."""

    __slots__ = (
        "_errors",
        "_parent",
        "_requests",
        "cached_ratio",
        "cached_tokens",
        "cold",
        "latency",
        "model",
        "prompt_tokens",
        "tenant",
        "ttft",
    )

    def __init__(self, metrics: GatewayMetrics, tenant: str, model: str) -> None:
        self.tenant, self.model, self._parent = tenant, model, metrics
        self.latency = metrics.latency.labels(tenant, model)
        self.ttft = metrics.ttft.labels(tenant, model)
        self.prompt_tokens = metrics.prompt_tokens.labels(tenant, model)
        self.cached_tokens = metrics.cached_tokens.labels(tenant, model)
        self.cached_ratio = metrics.cached_ratio.labels(tenant, model)
        self.cold = metrics.cold.labels(tenant, model)
        self._requests: dict[tuple[str, int], Counter] = {}
        self._errors: dict[str, Counter] = {}

    def requests(self, endpoint: str, status: int) -> Counter:
        found = self._requests.get((endpoint, status))
        if found is None:
            found = self._requests[(endpoint, status)] = self._parent.requests.labels(
                self.tenant, self.model, endpoint, str(status)
            )
        return found

    def errors(self, code: str) -> Counter:
        found = self._errors.get(code)
        if found is None:
            found = self._errors[code] = self._parent.errors.labels(self.tenant, self.model, code)
        return found
