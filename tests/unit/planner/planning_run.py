"""Running the planner's reactions as the planner does, without its task: a committed batch's triggers put
into a planning queue and handled at once (burst mode)."""

from __future__ import annotations

import time

from warmplane.services.planner.bootstrap import planning_handlers
from warmplane.services.planner.core.ingest_batch import IngestBatch
from warmplane.services.planner.core.triggers import triggers_of
from warmplane.services.planner.fleet_reactions import FleetReactor
from warmplane.services.planner.planning import Planning


async def react(reactor: FleetReactor, batch: IngestBatch) -> int:
    """Plan what committed `batch` triggers, through `reactor`'s handlers; how many triggers were handled.
    A handler's failure is counted on the reactor's metrics, as in the planner."""
    planning = Planning(planning_handlers(reactor), depth=64, metrics=reactor._metrics)
    await planning.put(triggers_of(batch, time.monotonic(), bucket_seconds=reactor.request_buckets_s))
    return await planning.burst()
