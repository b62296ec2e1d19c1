"""Wiring the planner: faststream batch subscribers over the traffic and lifecycle topics.

Two consumer groups feed the one ingestor: `group_id` reads the traffic, heartbeats and warm results, and
`lifecycle_group(group_id)` the lifecycle topic alone. aiokafka sends no fetch to a broker while records
of any partition it fetched there wait unconsumed (its `prefetch_backoff`, `ingestor.py`'s doc): in one
consumer, a replica's start waited behind every request batch fetched before it. A consumer of its own
fetches a start as soon as it is written, and the requests' fetches stay as large as before. The ingestor
writes the lifecycle records in its urgent lane, their offsets under `group_id` in Postgres as before.

`build_planner` makes the app from settings over the parts `bootstrap` wires; its lifespan starts every
resource (the Postgres pool, the producer of dead letters and plans, the writer and planning tasks, the
metrics endpoint, the retention sweep, the plan catch-up and the liveness watch) and releases them in
reverse order. Nothing is created at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from aiokafka import (
    AIOKafkaConsumer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    TopicPartition,
)
from faststream import AckPolicy, FastStream
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from faststream.kafka.subscriber.usecase import BatchSubscriber
from faststream.message import StreamMessage
from faststream.security import BaseSecurity, SASLPlaintext, SASLScram256, SASLScram512
from prometheus_client import CollectorRegistry, start_http_server

from warmplane.services.planner.bootstrap import PlannerParts, bootstrap
from warmplane.services.planner.fleet_reactions import FleetReactor
from warmplane.services.planner.ingestor import Ingestor, Offsets, Partition
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.pg_retention import sweep_counts, sweep_history
from warmplane.services.planner.pg_store import PgIngestStore
from warmplane.services.planner.plans import PlanIssuer
from warmplane.services.planner.settings import PlannerSettings, PlanSettings
from warmplane.shared.consumer_lag import report_lag_forever
from warmplane.shared.event_publisher import acknowledging_producer
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.kafka_clients import tls_context
from warmplane.shared.postgres_pool import new_pool
from warmplane.shared.schema_check import require_schema_at_head
from warmplane.shared.settings import KafkaSecurity
from warmplane.shared.topics import Topics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Planner:
    """The planner's app and its metrics, which tests and benchmarks read in-process.

    Run it as a process of its own with `await planner.app.run()`: faststream's `run` installs SIGINT and
    SIGTERM handlers that stop it. Run it inside a process that handles its own signals (`warmplane up`,
    tests, benchmarks) with `await planner.serve()`. Stop either with `exit()`."""

    app: FastStream
    metrics: PlannerMetrics
    _stopping: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def exit(self) -> None:
        """Ask the planner to stop (drain, commit, close); `run()` or `serve()` then returns."""
        self.app.exit()
        self._stopping.set()

    async def serve(self) -> None:
        """Run the planner until `exit()` or cancellation, installing no signal handlers.

        `app.run()` would replace the process's SIGINT and SIGTERM handlers with its own (faststream's
        `set_exit`): a signal would then stop the planner alone, unseen by the process that embeds it.
        The lifespan's resources are released however this ends; a failed start raises."""
        async with self.app.lifespan_context():
            try:
                await self.app.start()
                await self._stopping.wait()
            finally:
                await self.app.stop()


def _security(security: KafkaSecurity) -> BaseSecurity | None:
    """`security` in faststream's terms: the options `kafka_clients.client_security` gives aiokafka."""
    context = tls_context(security) if security.tls else None
    if not security.sasl:
        return None if context is None else BaseSecurity(ssl_context=context, use_ssl=True)
    login = {"PLAIN": SASLPlaintext, "SCRAM-SHA-256": SASLScram256, "SCRAM-SHA-512": SASLScram512}
    password = security.sasl_password.get_secret_value()
    return login[security.sasl_mechanism](
        security.sasl_username, password, ssl_context=context, use_ssl=security.tls
    )


def planner_topics(topics: Topics) -> tuple[str, ...]:
    """The topics the planner reads: traffic, lifecycle, heartbeats, warm results (the lifecycle topic in a
    consumer group of its own, `build_planner`)."""
    return (topics.requests, topics.misses, topics.lifecycle, topics.heartbeats, topics.warm_results)


def build_planner(settings: PlannerSettings) -> Planner:
    """The planner, wired from `settings` (`bootstrap`); nothing starts until its app runs. Call it on the
    event loop it will run on (its Postgres pool is made there)."""
    kafka = settings.kafka
    topics = Topics(kafka.topic_prefix)
    broker = KafkaBroker(
        kafka.bootstrap_servers,
        security=_security(kafka.security),
        client_id=f"{kafka.client_id}-planner",
        request_timeout_ms=kafka.request_timeout_ms,
        log_level=logging.DEBUG,  # one access-log line per batch is noise at INFO
        # Our logger, under the root's level and handlers (faststream's own prints INFO to stdout).
        logger=log.getChild("broker"),
    )
    metrics = PlannerMetrics(CollectorRegistry())

    def stop() -> None:  # the writer stopped for good: so does the planner (made below)
        planner.exit()

    parts = bootstrap(
        settings,
        pool=new_pool(settings.postgres, init=PgIngestStore.prepare_session),
        producer=acknowledging_producer(kafka, "planner-out"),  # dead letters, plans, bumps, liveness
        metrics=metrics,
        on_failure=stop,
    )
    ingestor = parts.ingestor
    ingest = settings.ingest
    bulk = tuple(topic for topic in planner_topics(topics) if topic != topics.lifecycle)
    # Starts get a consumer of their own (module doc): the requests' fetches never hold them back.
    subscribers = [
        _subscribe(
            broker,
            settings,
            ingestor,
            bulk,
            group_id=ingest.group_id,
            poll_ms=ingest.batch_timeout_ms,
            counting=(topics.requests, parts.issuer.counting_alone),
        ),
        _subscribe(
            broker,
            settings,
            ingestor,
            (topics.lifecycle,),
            group_id=lifecycle_group(ingest.group_id),
            poll_ms=_LIFECYCLE_POLL_MS,
        ),
    ]
    consumers = [_consumer_of(subscriber) for subscriber in subscribers]

    @contextlib.asynccontextmanager
    async def lifespan(context: Any = None) -> AsyncIterator[None]:
        metrics.loop_tasks.watch(asyncio.get_running_loop())
        async with _running(settings, topics, parts):
            lag = asyncio.create_task(
                report_lag_forever(
                    consumers,
                    metrics.consumer_lag,
                    interval_s=kafka.lag_interval_s,
                    timeout_s=kafka.request_timeout_ms / 1000,
                ),
                name="planner-consumer-lag",
            )
            try:
                yield
            finally:
                await _cancel(lag)
            # faststream stops consuming before the lifespan exits: drain while offsets can commit, then
            # plan what the last batches triggered.
            await ingestor.drain()
            await parts.planning.drain(settings.plans.planning_drain_s)

    planner = Planner(FastStream(broker, lifespan=lifespan), metrics)
    return planner


_LIFECYCLE_POLL_MS = 10
"""The lifecycle consumer's poll: faststream's batch subscriber sleeps this long after a poll that found
nothing, so at the traffic's `batch_timeout_ms` an idle planner's start waited for most of that sleep
before its handler, several times the broker's own hop (`bench.plan_latency_bench` times both)."""


def lifecycle_group(group_id: str) -> str:
    """The consumer group that reads the lifecycle topic beside the planner's `group_id` (module doc).
    Postgres keeps both groups' positions under `group_id`: they read different topics."""
    return f"{group_id}-lifecycle"


def _subscribe(
    broker: KafkaBroker,
    settings: PlannerSettings,
    ingestor: Ingestor,
    topics: Sequence[str],
    *,
    group_id: str,
    poll_ms: int,
    counting: tuple[str, Callable[[bool], None]] | None = None,
) -> BatchSubscriber:
    """A batch subscriber of `topics` in `group_id` that hands its records to `ingestor` undecoded. It
    waits up to `poll_ms` for records, and after a poll that found nothing faststream sleeps as long.
    With `counting` (the requests topic and a callback), each assignment says whether this consumer owns
    every partition of that topic: whether this planner alone counts the requests."""
    kafka, ingest = settings.kafka, settings.ingest
    subscriber = broker.subscriber(
        *topics,
        batch=True,
        group_id=group_id,
        auto_offset_reset="earliest",
        ack_policy=AckPolicy.MANUAL,
        max_records=ingest.batch_max_records,
        batch_timeout_ms=poll_ms,
        fetch_max_wait_ms=kafka.fetch_max_wait_ms,
        max_partition_fetch_bytes=ingest.max_partition_fetch_bytes,
        session_timeout_ms=kafka.session_timeout_ms,
        heartbeat_interval_ms=kafka.heartbeat_interval_ms,
        parser=_parse_first_record_only,
        decoder=_leave_undecoded,
        listener=_Rebalance(ingestor, group_id, lambda: subscriber.consumer, counting),
    )

    @subscriber
    async def on_batch(msg: KafkaMessage) -> None:
        records = msg.raw_message if isinstance(msg.raw_message, tuple) else (msg.raw_message,)
        consumer: AIOKafkaConsumer = msg.consumer
        await ingestor.submit(records, KafkaConsumerPort(consumer, group_id, kafka.commit_timeout_s))

    return subscriber


def _consumer_of(subscriber: BatchSubscriber) -> Callable[[], AIOKafkaConsumer | None]:
    """A getter of `subscriber`'s consumer, which exists once the broker started."""
    return lambda: subscriber.consumer


_STOP_TIMEOUT_S = 30.0


@contextlib.asynccontextmanager
async def running_planner(settings: PlannerSettings) -> AsyncIterator[Planner]:
    """A planner built from `settings` and served in this process's event loop until the block ends, then
    stopped gracefully (drained, offsets committed). Raises TimeoutError if stopping takes over 30 s."""
    planner = build_planner(settings)
    task = asyncio.create_task(planner.serve())
    try:
        yield planner
    finally:
        planner.exit()
        await asyncio.wait_for(task, _STOP_TIMEOUT_S)


@contextlib.asynccontextmanager
async def _running(settings: PlannerSettings, topics: Topics, parts: PlannerParts) -> AsyncIterator[None]:
    """The resources started (topics, the pool at the schema's head, the producer, the metrics endpoint)
    and the parts' tasks running; all stopped in reverse on exit."""
    await ensure_topics(settings.kafka, topics.all())
    pool, producer = parts.pool, parts.producer
    async with contextlib.AsyncExitStack() as stack:
        await pool
        stack.push_async_callback(pool.close)
        await require_schema_at_head(pool)
        await producer.start()
        stack.push_async_callback(producer.stop)
        if settings.metrics_port:
            server, _thread = start_http_server(settings.metrics_port, registry=parts.metrics.registry)
            stack.callback(server.shutdown)
        parts.ingestor.start()
        parts.planning.start()
        stack.push_async_callback(parts.planning.drain, 0)  # cancelled, if the lifespan did not drain it
        stack.push_async_callback(parts.issuer.close)  # reads made again ahead of plans, before the pool goes
        sweeper = asyncio.create_task(_sweep_forever(parts.store, pool, settings), name="planner-retention")
        stack.push_async_callback(_cancel, sweeper)
        catcher = asyncio.create_task(
            _catch_up_forever(parts.issuer, parts.reactor, settings.plans), name="planner-catch-up"
        )
        stack.push_async_callback(_cancel, catcher)
        watch = asyncio.create_task(parts.liveness.run_forever(), name="planner-liveness")
        stack.push_async_callback(_cancel, watch)
        yield


async def _parse_first_record_only(
    records: tuple[ConsumerRecord, ...],
    original: Callable[[tuple[ConsumerRecord, ...]], Awaitable[StreamMessage[Any]]],
) -> StreamMessage[Any]:
    """The batch's message, parsed from its first record only, carrying every record raw. faststream's
    batch parser copies each record's value and decodes its headers into a dictionary, which the
    handler never reads (it decodes the raw records itself): measured at 0.6 us an event."""
    message = await original(records[:1])
    message.raw_message = records
    return message


async def _leave_undecoded(msg: StreamMessage[Any]) -> None:
    """The handler decodes with the event codec itself. faststream's own decoder would parse every
    record of a batch again and JSON-decode it: measured at 16 us an event, most of the ingest cost."""
    return None


class KafkaConsumerPort:
    """The writer's view of the faststream-owned consumer: bounded commits, seeks, ownership."""

    def __init__(self, consumer: AIOKafkaConsumer, group: str, timeout_s: float) -> None:
        self._consumer = consumer
        self.group = group
        self._timeout_s = timeout_s

    async def commit(self, offsets: Offsets) -> None:
        assigned = self._consumer.assignment()
        mine = {tp: offset for (t, p), offset in offsets.items() if (tp := TopicPartition(t, p)) in assigned}
        if mine:
            # Bounded: a consumer facing a broker that lost its topics would otherwise retry forever.
            async with asyncio.timeout(self._timeout_s):
                await self._consumer.commit(mine)

    def seek(self, partition: Partition, offset: int) -> None:
        self._consumer.seek(TopicPartition(*partition), offset)

    def owns(self, partition: Partition) -> bool:
        return TopicPartition(*partition) in self._consumer.assignment()


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Resume each assigned partition where Postgres says this group stands; finish writing what was
    read from revoked partitions before another consumer takes them."""

    def __init__(
        self,
        ingestor: Ingestor,
        group: str,
        consumer: Callable[[], AIOKafkaConsumer | None],
        counting: tuple[str, Callable[[bool], None]] | None = None,
    ) -> None:
        self._ingestor = ingestor
        self._group = group
        self._consumer = consumer
        """The subscriber's consumer, which exists once the broker started."""
        self._counting = counting
        """The requests topic, and what is told whether this consumer owns all its partitions."""

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        if self._counting is not None:
            self._counting[1](False)
        await self._ingestor.flush(self._group)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        consumer = self._consumer()
        if consumer is None:
            raise RuntimeError("partitions assigned before the planner's consumer started")
        positions = await self._ingestor.restore([(tp.topic, tp.partition) for tp in assigned])
        for partition, offset in positions.items():
            consumer.seek(TopicPartition(*partition), offset)
        log.info("resumed %d of %d assigned partitions from Postgres", len(positions), len(assigned))
        if self._counting is not None:
            topic, alone = self._counting
            every = consumer.partitions_for_topic(topic) or set()
            mine = {tp.partition for tp in consumer.assignment() if tp.topic == topic}
            alone(bool(every) and every <= mine)


async def _sweep_forever(store: PgIngestStore, pool: asyncpg.Pool, settings: PlannerSettings) -> None:
    ingest = settings.ingest
    while True:
        await asyncio.sleep(ingest.sweep_interval_s)
        now = datetime.now(UTC)
        try:
            ledger, catalog = await store.sweep(
                ledger_before=now - timedelta(hours=ingest.ledger_retention_hours),
                catalog_before=now - timedelta(hours=ingest.catalog_retention_hours),
            )
            moved, stats, chains = await sweep_counts(
                pool,
                now,
                detail_hours=ingest.detail_retention_hours,
                stats_hours=ingest.stats_retention_hours,
                bucket_seconds=settings.statistics.bucket_seconds,
                chains_slack_s=2 * ingest.node_cache_max_age_s,
            )
            history = await sweep_history(pool, now - timedelta(hours=ingest.history_retention_hours))
            log.info(
                "retention sweep removed %d ledger rows, %d catalog payloads, %d statistics rows,"
                " %d rows of chains and %d rows of replica history, and summed %d prefix counts per scope",
                ledger,
                catalog,
                stats,
                chains,
                history,
                moved,
            )
        except (OSError, asyncpg.PostgresError):
            log.warning("retention sweep failed; retrying next interval", exc_info=True)


async def _catch_up_forever(issuer: PlanIssuer, reactor: FleetReactor, plans: PlanSettings) -> None:
    while True:
        await asyncio.sleep(plans.catch_up_interval_s)
        try:
            await reactor.catch_up(plans.catch_up_grace_s)
            await issuer.catch_up()
        except (OSError, asyncpg.PostgresError):
            log.warning("plan catch-up failed; retrying next interval", exc_info=True)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
