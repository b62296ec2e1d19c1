"""The gateway process: `async with Gateway(settings) as gateway:` serves until the block ends.

`Gateway` owns the emitter (events out, never awaited on the serving path), the lifecycle follower (or
the static replicas of `WARMPLANE_STATIC_REPLICAS`), the pooled HTTP client to the replicas, and uvicorn.
Start-up waits at most `catch_up_timeout_s` for the lifecycle topic to be read to its end, then serves
with what it knows and says so in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType
from typing import Self

from warmplane.services.gateway.app import GatewayParts, bootstrap
from warmplane.services.gateway.lifecycle_follower import LifecycleFollower
from warmplane.services.gateway.membership import Membership, Replica, ReplicaTable, static_membership
from warmplane.services.gateway.observations import EventSink
from warmplane.services.gateway.registry import seed_from_registry
from warmplane.services.gateway.settings import GatewaySettings
from warmplane.services.gateway.tenants import EpochBook
from warmplane.services.gateway.upstream import AiohttpUpstream
from warmplane.shared.asgi_server import AsgiServer
from warmplane.shared.emitter import Emitter
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.topics import Topics

log = logging.getLogger(__name__)
_STOP_TIMEOUT_S = 5.0


def upstream_client(settings: GatewaySettings) -> AiohttpUpstream:
    """Pooled HTTP/1.1 connections to the replicas; every phase of a call has a timeout."""
    options = settings.gateway
    return AiohttpUpstream(
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
        self.parts = bootstrap(settings, membership=membership, sink=sink, client=client, epochs=epochs)
        await self._serve(self.parts)

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
        follower = self.follower = LifecycleFollower(settings.kafka, topics.lifecycle, group, table, epochs)
        await follower.start()
        self._stack.push_async_callback(follower.stop)
        try:
            await asyncio.wait_for(follower.caught_up.wait(), options.catch_up_timeout_s)
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
        await self._stack.aclose()
