"""The warmer of one node: reads the plans topic, drives its replicas, reports, serves readiness.

`Warmer` owns a producer (lifecycle, heartbeats and warm results, acknowledged and retried in order
through one outbox, `outbox.py`), a consumer of the plans topic in the node's own group
(`<group_id_prefix>-<node>`, from the earliest offset: every node reads every plan and keeps its own), one
`ReplicaDriver` per engine, a heartbeat for each live replica every `WARMPLANE_HEARTBEAT__INTERVAL_S`, and
the HTTP server of `/ready`. A plan is handed to its replica's tracker before its offset is committed; a
redelivered plan is recognised by id and applied once. Plans for another node are skipped; a plan for a
replica this warmer does not drive, or one its tracker refuses (older epoch, past its deadline, for an
earlier start), is answered with a `warm.finished` that says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from warmplane.services.warmer.core.replica import Phase, ReplicaTracker, policy_from
from warmplane.services.warmer.http import status_server
from warmplane.services.warmer.metrics import WarmerMetrics
from warmplane.services.warmer.outbox import Outbox
from warmplane.services.warmer.replica_driver import ReplicaDriver, refusal
from warmplane.services.warmer.settings import EngineSettings, WarmerSettings
from warmplane.services.warmer.vllm_client import VllmEngineClient
from warmplane.shared.cache_salt import SaltBook
from warmplane.shared.codec import DecodeFailure, EventCodec
from warmplane.shared.consumer_lag import report_lag_forever
from warmplane.shared.dead_letters import DeadLetter, KafkaDeadLetterSink, reason_class
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.event_publisher import KafkaEventPublisher, acknowledging_producer
from warmplane.shared.event_signing import EventSigner
from warmplane.shared.events import WarmPlanIssued
from warmplane.shared.group_consumer import group_consumer
from warmplane.shared.kafka_admin import ensure_topics
from warmplane.shared.topics import Topics

log = logging.getLogger(__name__)
_BACKOFF_MAX_S = 5.0
_OUTBOX_CHUNK = 500


class Warmer:
    """`async with Warmer(settings) as warmer:` starts everything; leaving stops it, runs cancelled."""

    def __init__(
        self,
        settings: WarmerSettings,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        new_id: Callable[[], uuid.UUID] = new_event_id,
    ) -> None:
        self.settings = settings
        self.metrics = WarmerMetrics(CollectorRegistry())
        self.drivers: dict[str, ReplicaDriver] = {}
        self._clock = clock
        self._new_id = new_id
        self._topics = Topics(settings.kafka.topic_prefix)
        self._codec = EventCodec(settings.kafka.max_event_bytes)
        self._signer = EventSigner(settings.event_keys)
        """Signs what this warmer publishes; plans not signed by a shared key are dead-lettered."""
        self._salts = SaltBook(settings.tenant_secrets, settings.unsalted_tenants)
        self._outbox = Outbox(self.metrics.outbox)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stack = contextlib.AsyncExitStack()
        self._http = status_server(self, settings.http_host, settings.http_port)

    @property
    def node(self) -> str:
        return self.settings.node

    @property
    def http_port(self) -> int:
        return self._http.port

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        kafka = self.settings.kafka
        self.metrics.loop_tasks.watch(asyncio.get_running_loop())
        try:
            await ensure_topics(kafka, self._topics.all())
            producer = acknowledging_producer(kafka, f"warmer-{self.node}")
            await producer.start()
            self._stack.push_async_callback(producer.stop)
            self._signer.say_if_off(f"warmer {self.node}")
            if unsalted := self.settings.unsalted_tenants:
                log.warning(
                    "warmer %s warms tenants %s without a cache_salt: their KV blocks are not isolated from"
                    " other unsalted traffic on the engine (WARMPLANE_UNSALTED_TENANTS)",
                    self.node,
                    sorted(unsalted),
                )
            publisher = KafkaEventPublisher(
                producer, self._topics, self._codec, self.settings.warm.publish_timeout_s, self._signer
            )
            dead_letters = KafkaDeadLetterSink(
                producer, self._topics.dead_letter, f"warmer/{self.node}", kafka.commit_timeout_s
            )
            consumer = group_consumer(
                kafka,
                self._topics.plans,
                name=f"warmer-{self.node}",
                group_id=f"{self.settings.group_id_prefix}-{self.node}",
            )
            await consumer.start()
            self._stack.push_async_callback(consumer.stop)
            await self._http.start()
            self._stack.push_async_callback(self._http.stop)
            self._spawn("outbox", self._drain_outbox(publisher))
            self._spawn("plans", self._consume_plans(consumer, dead_letters))
            self._spawn(
                "lag",
                report_lag_forever(
                    [lambda: consumer],
                    self.metrics.consumer_lag,
                    interval_s=kafka.lag_interval_s,
                    timeout_s=kafka.request_timeout_ms / 1000,
                ),
            )
            self._spawn("heartbeats", self._heartbeat_forever())
            for engine in self.settings.engines:
                self.add_engine(engine)
        except BaseException:
            await self.stop()
            raise

    def add_engine(self, engine: EngineSettings) -> ReplicaDriver:
        """Start driving `engine` (a replica scheduled on this node): it is announced as starting now."""
        if engine.replica in self.drivers:
            raise ValueError(f"replica {engine.replica!r} is already driven by this warmer")
        warm, readiness = self.settings.warm, self.settings.readiness
        client = VllmEngineClient(
            engine.url,
            engine.served_model,
            connect_timeout_s=warm.connect_timeout_s,
            request_timeout_s=warm.request_timeout_s,
            health_timeout_s=warm.health_timeout_s,
            block_size=engine.block_size,
        )
        self._stack.push_async_callback(client.aclose)
        self.metrics.add_replica(engine.replica)
        policy = policy_from(
            concurrency=warm.concurrency,
            ready_concurrency=warm.ready_concurrency,
            crash_after_failures=warm.crash_after_failures,
            plan_wait_s=readiness.plan_wait_s,
            on_deadline=readiness.on_deadline,
            min_verified_fraction=readiness.min_verified_fraction,
            warm=readiness.warm,
        )
        driver = ReplicaDriver(
            node=self.node,
            engine=engine,
            client=client,
            tracker=ReplicaTracker(engine.replica, policy, self._new_id),
            salts=self._salts,
            warm=warm,
            publish=self._outbox.put,
            metrics=self.metrics,
            clock=self._clock,
        )
        self.drivers[engine.replica] = driver
        self._spawn(f"replica {engine.replica}", driver.run())
        return driver

    async def drain(self, reason: str = "the warmer was told to stop") -> None:
        """Take every replica this warmer drives out of the fleet, as its pod goes away: each is announced
        draining (routers stop sending it requests; `/ready` turns 503), then stopped once its engine has
        no request in flight (`WARMPLANE_DRAIN__*`). Plans that arrive meanwhile are refused. Returns
        when the last `replica.stopped` is published (bounded by the publish timeout)."""
        loops = [task for name in self.drivers if (task := self._tasks.pop(f"replica {name}", None))]
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        drain = self.settings.drain
        await asyncio.gather(
            *(
                driver.drain(reason, settle_s=drain.settle_s, timeout_s=drain.timeout_s)
                for driver in self.drivers.values()
            )
        )
        await self._published()

    def drained(self) -> bool:
        """Whether every replica of this warmer has been announced stopped."""
        return all(driver.tracker.phase is Phase.STOPPED for driver in self.drivers.values())

    async def stop(self) -> None:
        """Stop the replicas' loops and the consumer, publish what is queued (bounded), close the rest."""
        outbox = self._tasks.pop("outbox", None)
        others = list(self._tasks.values())
        self._tasks.clear()
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        if outbox is not None:
            await self._published()
            outbox.cancel()
            await asyncio.gather(outbox, return_exceptions=True)
        await self._stack.aclose()

    async def _published(self) -> None:
        """Until every queued event is published, at most the publish timeout."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.warm.publish_timeout_s):
                await self._outbox.join()

    def alive(self) -> bool:
        """Whether every loop of the warmer still runs (the consumer, the outbox, each replica's)."""
        return bool(self._tasks) and not any(task.done() for task in self._tasks.values())

    def ready(self, replica: str | None = None) -> bool:
        """`replica`'s readiness; for None, true iff this warmer drives replicas and all are ready."""
        if replica is not None:
            return self.drivers[replica].tracker.ready
        return bool(self.drivers) and all(driver.tracker.ready for driver in self.drivers.values())

    def _spawn(self, name: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"warmer {name}")
        task.add_done_callback(self._died)
        self._tasks[name] = task

    def _died(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (error := task.exception()) is not None:
            log.critical("%s stopped: %r", task.get_name(), error, exc_info=error)

    async def _consume_plans(self, consumer: AIOKafkaConsumer, dead_letters: KafkaDeadLetterSink) -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=500, max_records=100)
            for records in batches.values():
                for record in records:
                    await self._handle(record, dead_letters)
            if batches:
                try:
                    await asyncio.wait_for(consumer.commit(), self.settings.kafka.commit_timeout_s)
                except Exception:  # redelivered plans are recognised by id; the next commit covers these
                    log.warning("could not commit plan offsets; they will be read again", exc_info=True)

    async def _handle(self, record: ConsumerRecord[bytes, bytes], dead_letters: KafkaDeadLetterSink) -> None:
        refusal = self._signer.refusal(record.value, record.headers)
        event = self._codec.decode(record.value) if refusal is None else DecodeFailure(refusal)
        if isinstance(event, DecodeFailure):
            await dead_letters.send_all([DeadLetter(record, event.reason)])
            self.metrics.dead_lettered.labels(reason_class(event.reason)).inc()
            log.warning("dead-lettered plans message at offset %d: %s", record.offset, event.reason)
            return
        if not isinstance(event, WarmPlanIssued) or event.node != self.node:
            self.metrics.plans.labels("other_node").inc()
            return
        self.offer(event)

    def offer(self, plan: WarmPlanIssued) -> None:
        """Hand `plan` (addressed to this node) to its replica, or answer why it will not run."""
        driver = self.drivers.get(plan.replica)
        if driver is None:
            self.metrics.plans.labels("unknown_replica").inc()
            reason = f"unknown replica {plan.replica!r} on node {self.node!r} (drives {sorted(self.drivers)})"
            log.warning("plan %s: %s", plan.plan_id, reason)
            self._outbox.put(refusal(plan, reason, producer=f"warmer/{self.node}", at=self._clock()))
            return
        decision = driver.tracker.offer(plan, self._clock())
        if decision.accepted:
            self.metrics.plans.labels("accepted").inc()
            driver.accepted(plan)
        elif decision.reason.startswith("duplicate"):
            self.metrics.plans.labels("duplicate").inc()
        else:
            self.metrics.plans.labels("dropped").inc()
            log.info("replica %s: dropped plan %s: %s", plan.replica, plan.plan_id, decision.reason)
            driver.refuse(plan, decision.reason)

    async def _heartbeat_forever(self) -> None:
        """Say every heartbeat interval that each replica this warmer drives is still alive (in the
        phases that send one), through the outbox: the planner marks a replica whose heartbeats stop
        while the rest of the fleet's go on as lost."""
        while True:
            await asyncio.sleep(self.settings.heartbeat.interval_s)
            for driver in list(self.drivers.values()):
                if (beat := driver.heartbeat()) is not None:
                    self._outbox.beat(beat)  # not while its previous beat waits for the broker

    async def _drain_outbox(self, publisher: KafkaEventPublisher) -> None:
        """Publish queued events in order, all that are waiting in one round of acknowledgements; events
        the broker does not acknowledge are retried (from the first of them), never lost while the warmer
        runs."""
        while True:
            events = await self._outbox.take(_OUTBOX_CHUNK)
            backoff = 0.1
            while True:
                try:
                    await publisher.publish_all(events)
                    break
                except Exception as error:
                    self.metrics.publish_retries.inc()
                    log.warning(
                        "could not publish %d events (%r); retrying in %.1f s", len(events), error, backoff
                    )
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, _BACKOFF_MAX_S)
            self._outbox.done(events)
