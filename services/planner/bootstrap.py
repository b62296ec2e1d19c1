"""`bootstrap()`: the planner's parts, wired from its settings over a Postgres pool and a Kafka producer that
are not yet started. No I/O here: the app's lifespan (`app.py`) starts the pool and the producer, then the
parts' tasks, and stops them in reverse.

The ingest writer commits a batch, and its `after_commit` hook puts what the batch triggers
(`core.triggers.triggers_of`) into the planning task (`planning.py`) and returns: planning runs off the
ingest path. The planning task hands each trigger to its handler, by type, from `planning_handlers`' table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
from aiokafka import AIOKafkaProducer

from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.core.node_cache import NodeCache
from warmplane.services.planner.core.triggers import (
    BumpToPlan,
    CountsToAbsorb,
    DeployToApply,
    HeartbeatsHeard,
    OutcomesReported,
    ReadyToReplan,
    RequestsCounted,
    RewarmToPlan,
    StartsToPlan,
    Trigger,
    triggers_of,
)
from warmplane.services.planner.fleet_reactions import FleetReactor
from warmplane.services.planner.ingestor import Ingestor, Offsets
from warmplane.services.planner.liveness import LivenessWatch
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.pg_fleet import PgFleetStore
from warmplane.services.planner.pg_liveness import PgLivenessStore
from warmplane.services.planner.pg_plans import PgPlanStore
from warmplane.services.planner.pg_store import PgIngestStore
from warmplane.services.planner.planning import Handler, Planning
from warmplane.services.planner.plans import PlanIssuer
from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.codec import EventCodec
from warmplane.shared.dead_letters import KafkaDeadLetterSink
from warmplane.shared.event_publisher import KafkaEventPublisher
from warmplane.shared.event_signing import EventSigner, SignedTopics
from warmplane.shared.topics import Topics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PlannerParts:
    """What the app runs: the pool and producer it starts, the ingestor (and its writer), the planning task
    and its handlers, the liveness watch, and what the periodic work uses."""

    pool: asyncpg.Pool
    producer: AIOKafkaProducer
    metrics: PlannerMetrics
    ingestor: Ingestor
    planning: Planning
    reactor: FleetReactor
    issuer: PlanIssuer
    liveness: LivenessWatch
    store: PgIngestStore


URGENT = frozenset({StartsToPlan, RewarmToPlan, BumpToPlan, DeployToApply, ReadyToReplan})
"""Triggers someone waits on (a replica for its plan before it turns ready, a tenant for its new epoch's
plans): ingestion yields to them (`planning.py`). Heartbeats, outcomes, request counts and counts to
absorb do not."""


def planning_handlers(reactor: FleetReactor) -> dict[type, Handler]:
    """The handler of each trigger type: the planner's one dispatch table."""
    return {
        StartsToPlan: reactor.plan_starts,
        BumpToPlan: reactor.plan_bump,
        DeployToApply: reactor.apply_deploy,
        ReadyToReplan: reactor.replan_ready,
        RewarmToPlan: reactor.rewarm,
        HeartbeatsHeard: reactor.hear,
        OutcomesReported: reactor.count_outcomes,
        RequestsCounted: reactor.judge_cold_starts,
        CountsToAbsorb: reactor.absorb_counts,
    }


def bootstrap(
    settings: PlannerSettings,
    *,
    pool: asyncpg.Pool,
    producer: AIOKafkaProducer,
    metrics: PlannerMetrics,
    on_failure: Callable[[], None],
) -> PlannerParts:
    """The planner's parts over `pool` and `producer` (dead letters, plans, bumps, liveness), neither
    started yet; `on_failure` is called when the writer stops for good."""
    kafka, ingest = settings.kafka, settings.ingest
    topics = Topics(kafka.topic_prefix)
    codec = EventCodec(kafka.max_event_bytes)
    signer = EventSigner(settings.event_keys)
    signer.say_if_off("planner")
    if settings.routing.mode == "spread":
        log.info("routing mode spread: each replica is planned for its share of every prefix's traffic")
    publisher = KafkaEventPublisher(producer, topics, codec, kafka.commit_timeout_s, signer)
    bucket_seconds = settings.statistics.bucket_seconds
    issuer = PlanIssuer(
        store=PgPlanStore(pool, ingest.group_id),
        publisher=publisher,
        settings=settings.plans,
        bucket_seconds=bucket_seconds,
        metrics=metrics,
        ring=settings.routing,
        max_plan_bytes=kafka.max_event_bytes,
    )
    liveness = LivenessWatch(
        store=PgLivenessStore(pool), publisher=publisher, settings=settings.heartbeat, metrics=metrics
    )
    reactor = FleetReactor(
        issuer=issuer,
        store=PgFleetStore(pool),
        publisher=publisher,
        cold_start=settings.cold_start,
        bucket_seconds=bucket_seconds,
        metrics=metrics,
        liveness=liveness,
    )
    planning = Planning(
        planning_handlers(reactor),
        depth=settings.plans.planning_queue_depth,
        metrics=metrics,
        urgent=URGENT,
        yield_s=settings.plans.ingest_yield_s,
    )

    async def after_commit(batch: IngestBatch, positions: Offsets) -> None:
        # The batch committed: what it triggers is planned from counts that include it (`planning.py`), and
        # the kept reads absorb its counts, while the planning task is free or before their next plan
        # (`kept_reads.py`).
        buckets = reactor.request_buckets_s
        triggers: list[Trigger] = triggers_of(batch, time.monotonic(), bucket_seconds=buckets)
        if issuer.counts_committed(batch, positions):
            triggers.append(CountsToAbsorb())
        committed = datetime.now(UTC)
        for trigger in triggers:
            if isinstance(trigger, StartsToPlan):
                for start in trigger.starts:
                    metrics.start_ingested_seconds.observe(
                        max(0.0, (committed - start.occurred_at).total_seconds())
                    )
        await planning.put(triggers)

    store = PgIngestStore(pool, ingest.group_id, bucket_seconds)
    letters = KafkaDeadLetterSink(producer, topics.dead_letter, ingest.group_id, kafka.commit_timeout_s)
    ingestor = Ingestor(
        codec=codec,
        signed=SignedTopics(signer, frozenset({topics.lifecycle, topics.heartbeats})),
        store=store,
        dead_letters=letters,
        metrics=metrics,
        node_cache=NodeCache(ingest.node_cache_size, ingest.node_cache_max_age_s),
        max_payload_bytes=ingest.catalog_max_payload_bytes,
        window_per_partition=ingest.dedup_window_per_partition,
        queue_depth=ingest.writer_queue_depth,
        urgent_topics=(topics.lifecycle,),
        db_outage_s=ingest.db_outage_s,
        on_failure=on_failure,
        after_commit=after_commit,
        before_batch=planning.yield_to_urgent,
    )
    return PlannerParts(pool, producer, metrics, ingestor, planning, reactor, issuer, liveness, store)
