"""Running the API: the asyncpg pool and the acknowledged Kafka publisher its routes use, the health
gauges' refresher, and uvicorn. Everything is opened in `serve` and closed when it returns."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator

from warmplane.services.api.answer_cache import AnswerCache
from warmplane.services.api.app import build_app
from warmplane.services.api.auth import TokenBook
from warmplane.services.api.deps import ApiDeps
from warmplane.services.api.metrics import HEALTH_WINDOW_S, ApiMetrics
from warmplane.services.api.pg_read import PgReadModel
from warmplane.services.api.settings import ApiSettings
from warmplane.shared.asgi_server import AsgiServer
from warmplane.shared.codec import EventCodec
from warmplane.shared.event_publisher import KafkaEventPublisher, acknowledging_producer
from warmplane.shared.event_signing import EventSigner
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.metrics_http import metrics_app
from warmplane.shared.postgres_pool import open_pool
from warmplane.shared.topics import Topics

log = logging.getLogger(__name__)
WARM_SETS_KEPT = 1_024
"""`/v1/warm-sets` answers kept at most (model x tenant scope x window)."""


@contextlib.asynccontextmanager
async def api_deps(settings: ApiSettings, metrics: ApiMetrics | None = None) -> AsyncIterator[ApiDeps]:
    """The real parts the routes use, open for the block's duration."""
    kafka = settings.kafka
    topics = Topics(kafka.topic_prefix)
    await ensure_topics(kafka, (topics.lifecycle,))
    pool = await open_pool(settings.postgres)
    producer = acknowledging_producer(kafka, "api")
    try:
        await producer.start()
        signer = EventSigner(settings.event_keys)
        signer.say_if_off("api")
        publisher = KafkaEventPublisher(
            producer,
            topics,
            EventCodec(max_event_bytes=kafka.max_event_bytes),
            kafka.request_timeout_ms / 1000,
            signer,
        )
        yield ApiDeps(
            read=PgReadModel(pool),
            events=publisher,
            tokens=TokenBook(settings.api_callers),
            options=settings.api,
            bucket_seconds=settings.statistics.bucket_seconds,
            metrics=metrics or ApiMetrics(),
            clock=time.time,
            warm_sets=AnswerCache(settings.api.warm_sets_cache_s, WARM_SETS_KEPT, time.monotonic),
        )
    finally:
        await producer.stop()
        await pool.close()


async def refresh_health(deps: ApiDeps) -> None:
    """Read the health figures of the last five minutes into the gauges; a tenant and model with no
    traffic any more is dropped from them."""
    span = deps.window(HEALTH_WINDOW_S)
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for row in await deps.read.traffic(span, None, None):
        total = totals[(row[1], row[2])]
        for i, value in enumerate(row[3:7]):
            total[i] += value
    metrics = deps.metrics
    for gauge in (metrics.prefix_hit_ratio, metrics.cold_requests, metrics.cold_start_ratio):
        gauge.clear()
    for (tenant, model), (requests, cold, prompt, cached) in totals.items():
        metrics.cold_requests.labels(tenant=tenant, model=model).set(cold)
        if prompt:
            metrics.prefix_hit_ratio.labels(tenant=tenant, model=model).set(cached / prompt)
        if requests:
            metrics.cold_start_ratio.labels(tenant=tenant, model=model).set(cold / requests)


async def _refresh_forever(deps: ApiDeps) -> None:
    while True:
        try:
            await refresh_health(deps)
        except Exception:
            deps.metrics.health_refresh_failures.inc()
            log.warning("could not read the health figures", exc_info=True)
        await asyncio.sleep(deps.options.health_refresh_s)


async def serve(settings: ApiSettings, stop: asyncio.Event) -> None:
    """Serve until `stop` is set (the process's SIGTERM or SIGINT), then stop in order: the servers
    (requests in flight get a bounded time), the health refresh, the producer and the pool."""
    if not settings.api_callers:
        log.warning(
            "WARMPLANE_API_CALLERS is empty: every endpoint but /status, /healthz and /readyz refuses"
        )
    options = settings.api
    async with api_deps(settings) as deps:
        deps.metrics.loop_tasks.watch(asyncio.get_running_loop())
        refresher = asyncio.create_task(_refresh_forever(deps), name="api-health-refresh")
        metrics = AsgiServer(
            metrics_app(deps.metrics.registry), options.metrics_host, options.metrics_port, name="api metrics"
        )
        server = AsgiServer(build_app(deps), options.http_host, options.http_port, name="api")
        try:
            await metrics.start()
            await server.start()
            await stop.wait()
        finally:
            await server.stop()
            await metrics.stop()
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
