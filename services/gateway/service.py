"""The gateway process: `async with Gateway(settings) as gateway:` serves until the block ends.

`Gateway` owns the emitter (events out, never awaited on the serving path), the lifecycle follower (or
the static replicas of `WARMPLANE_STATIC_REPLICAS`), the pooled HTTP client to the replicas, the result
cache's Redis client and Postgres pool (when `WARMPLANE_RESULT_CACHE__ENABLED`), and uvicorn.
Start-up waits at most `catch_up_timeout_s` for the lifecycle topic to be read to its end, then serves
with what it knows and says so in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType
from typing import Self

import asyncpg
import redis

from warmplane.services.gateway.app import GatewayParts, bootstrap
from warmplane.services.gateway.embedders import open_embedder
from warmplane.services.gateway.httptools_upstream import HttpToolsUpstream
from warmplane.services.gateway.lifecycle_follower import LifecycleFollower
from warmplane.services.gateway.membership import Membership, Replica, ReplicaTable, static_membership
from warmplane.services.gateway.observations import EventSink
from warmplane.services.gateway.registry import seed_from_registry
from warmplane.services.gateway.result_cache import ResultCache
from warmplane.services.gateway.result_stores import PgQueryIndex, RedisAnswers, ResultStores, redis_client
from warmplane.services.gateway.result_warming import HotPrompts
from warmplane.services.gateway.settings import GatewaySettings
from warmplane.services.gateway.tenants import EpochBook
from warmplane.shared.asgi_server import AsgiServer
from warmplane.shared.emitter import Emitter
from warmplane.shared.event_signing import EventSigner
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.postgres_pool import open_pool
from warmplane.shared.topics import Topics

log = logging.getLogger(__name__)
_STOP_TIMEOUT_S = 5.0


def upstream_client(settings: GatewaySettings) -> HttpToolsUpstream:
    """Pooled HTTP/1.1 connections to the replicas; every phase of a call has a timeout."""
    options = settings.gateway
    return HttpToolsUpstream(
        connect_timeout_s=options.connect_timeout_s,
        read_timeout_s=options.read_timeout_s,
        keepalive_s=options.keepalive_s,
    )


class Gateway:
    """`sink` replaces the emitter (tests); without it events go to Kafka through `Emitter`."""

    def __init__(self, settings: GatewaySettings, *, sink: EventSink | None = None) -> None:
        self.settings = settings
        self._sink = sink
        self._stack = contextlib.AsyncExitStack()
        self._http: AsgiServer | None = None
        self._metrics_http: AsgiServer | None = None
        self.parts: GatewayParts | None = None
        self.follower: LifecycleFollower | None = None

    @property
    def port(self) -> int:
        if self._http is None:
            raise RuntimeError("the gateway is not started")
        return self._http.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """The metrics port's base URL (`/metrics`), apart from the clients' `url`."""
        if self._metrics_http is None:
            raise RuntimeError("the gateway is not started")
        return f"http://127.0.0.1:{self._metrics_http.port}"

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        settings = self.settings
        topics = Topics(settings.kafka.topic_prefix)
        sink = self._sink
        if sink is None:
            emitter = Emitter(settings.kafka, settings.emitter, topics)
            await emitter.start()
            self._stack.push_async_callback(emitter.close)
            sink = emitter
        epochs = EpochBook()
        membership = await self._membership(topics, epochs)
        client = upstream_client(settings)
        self._stack.push_async_callback(client.close)
        stores = await self._result_stores() if settings.result_cache.enabled else None
        embedder = None
        if stores is not None and stores.index is not None:
            embedder = await open_embedder(settings.result_cache, self._stack)
        self.parts = bootstrap(
            settings,
            membership=membership,
            sink=sink,
            client=client,
            epochs=epochs,
            stores=stores,
            embedder=embedder,
        )
        self.parts.metrics.loop_tasks.watch(asyncio.get_running_loop())
        if self.parts.results is not None:
            self._keep_results_tidy(self.parts.results)
            await self._warm_results(self.parts.results, epochs)
        await self._serve(self.parts)

    async def _warm_results(self, results: ResultCache, epochs: EpochBook) -> None:
        """L1 warmed before the gateway serves, within `warm_timeout_s`; a store that fails or is slow
        leaves it colder, never stops the start."""
        options = self.settings.result_cache
        try:
            async with asyncio.timeout(options.warm_timeout_s):
                held = await results.warm(epochs.epoch)
        except (OSError, TimeoutError, redis.RedisError) as exc:
            log.warning("the result cache starts cold: warming failed (%s)", type(exc).__name__)
        else:
            log.info("the result cache holds %d answers, the most asked of the last 24 hours", held)

    async def _result_stores(self) -> ResultStores:
        """Redis for answers; Postgres for the semantic tier's vectors, if it is on and reachable (if
        not, the tier is off for this process's life, and the log says why: serving goes on)."""
        settings = self.settings
        client = redis_client(settings.redis)
        self._stack.push_async_callback(client.aclose)
        index = None
        if settings.result_cache.semantic:
            try:
                pool = await open_pool(settings.postgres)
            except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
                log.warning("the semantic result tier is off: Postgres could not be reached (%s)", exc)
            else:
                self._stack.push_async_callback(pool.close)
                index = PgQueryIndex(pool)
        return ResultStores(RedisAnswers(client), index, HotPrompts(client))

    def _keep_results_tidy(self, results: ResultCache) -> None:
        """Expired query vectors swept every `sweep_s`, a retired epoch's at once after its bump; at stop,
        answers being kept get a bounded wait."""
        every_s = self.settings.result_cache.sweep_s

        async def sweep_forever() -> None:
            while True:
                await results.next_sweep(every_s)
                try:
                    swept = await results.sweep()
                except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
                    log.warning("expired or retired result-cache vectors were not swept (%s)", exc)
                else:
                    log.debug("swept %d expired or retired result-cache vectors", swept)

        async def flush_forever() -> None:
            while True:
                await asyncio.sleep(self.settings.result_cache.asks_flush_s)
                try:
                    await results.flush_asks()
                except (OSError, TimeoutError, redis.RedisError) as exc:
                    log.debug("the result cache's asks were not recorded (%s)", type(exc).__name__)

        loop = asyncio.get_running_loop()
        sweeper = loop.create_task(sweep_forever(), name="result-cache-sweeper")
        flusher = loop.create_task(flush_forever(), name="result-cache-asks")

        async def stop_sweeping() -> None:
            sweeper.cancel()
            flusher.cancel()
            await asyncio.gather(sweeper, flusher, return_exceptions=True)
            with contextlib.suppress(OSError, TimeoutError, redis.RedisError):  # the last asks, bounded
                async with asyncio.timeout(_STOP_TIMEOUT_S):
                    await results.flush_asks()

        self._stack.push_async_callback(stop_sweeping)
        self._stack.push_async_callback(results.drain, _STOP_TIMEOUT_S)

    async def _membership(self, topics: Topics, epochs: EpochBook) -> Membership:
        settings = self.settings
        if settings.static_replicas:
            return static_membership(
                Replica(r.replica, r.url.rstrip("/"), r.model, r.model_revision)
                for r in settings.static_replicas
            )
        table = ReplicaTable()
        options = settings.gateway
        if options.registry_seed:
            seeded = await seed_from_registry(
                settings.postgres, table, epochs, timeout_s=options.registry_timeout_s
            )
            if seeded is not None:
                log.info("from the registry: %d replicas, %d epochs", *seeded)
        await ensure_topics(settings.kafka, (topics.lifecycle,))
        group = f"{options.group_id_prefix}-{options.instance}"
        signer = EventSigner(settings.event_keys)
        signer.say_if_off("gateway")
        follower = LifecycleFollower(settings.kafka, topics.lifecycle, group, table, epochs, signer=signer)
        self.follower = follower
        await follower.start()
        self._stack.push_async_callback(follower.stop)
        try:
            async with asyncio.timeout(options.catch_up_timeout_s):
                await follower.caught_up.wait()
        except TimeoutError:
            log.warning(
                "the lifecycle topic %s was not read to its end within %.0f s: serving with %s known",
                topics.lifecycle,
                options.catch_up_timeout_s,
                table.models() or "no models",
            )
        return table

    async def _serve(self, parts: GatewayParts) -> None:
        options = self.settings.gateway
        self._metrics_http = AsgiServer(
            parts.metrics_app, options.metrics_host, options.metrics_port, name="gateway metrics"
        )
        await self._metrics_http.start()
        self._http = AsgiServer(
            parts.app,
            options.http_host,
            options.http_port,
            name="gateway",
            stop_timeout_s=_STOP_TIMEOUT_S,
            coalesce_writes=True,
        )
        await self._http.start()

    async def stop(self) -> None:
        """Stop taking requests (in-flight ones finish within a bound), then close the rest."""
        if self._http is not None:
            await self._http.stop()
        if self._metrics_http is not None:
            await self._metrics_http.stop()
        await self._stack.aclose()
