"""Admin actions: bump an epoch, re-warm a replica, announce a deploy or a scale (the webhook CI/CD and
autoscalers call).

Each action is an event published, acknowledged by the broker, to the lifecycle topic, where the
planner acts on it like on any other producer's; the answer (202) names the event. The event's
`producer` is `api:<token name>`, so the fleet history says who acted. Admin tokens only.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, HTTPException, status

from warmplane.services.api.auth import Principal
from warmplane.services.api.deps import ApiDeps, Caller, Deps
from warmplane.services.api.routes_read import ERRORS
from warmplane.services.api.schemas import (
    Accepted,
    AnnounceDeploy,
    AnnounceScale,
    BumpEpoch,
    Name,
    Problem,
    RewarmReplica,
)
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    DeployFinished,
    DeployStarted,
    EpochBumped,
    Event,
    FleetScaled,
    ModelRef,
    ReplicaRewarmRequested,
    event_type,
)

router = APIRouter(
    prefix="/v1",
    responses={
        **ERRORS,
        400: {"model": Problem, "description": "the body is not JSON"},
        413: {"model": Problem, "description": "the body is larger than WARMPLANE_API__MAX_BODY_BYTES"},
        415: {"model": Problem, "description": "the body is not sent as application/json"},
        503: {"model": Problem, "description": "the broker did not take the event"},
    },
)


@router.post("/epochs/bump", response_model=Accepted, status_code=status.HTTP_202_ACCEPTED)
async def bump_epoch(deps: Deps, caller: Caller, tenant: Name, model: Name, body: BumpEpoch) -> Accepted:
    """Move (tenant, model) to the next cache epoch: every salt and key of the current one is dead, and
    the planner plans the new epoch's warm sets on the model's live replicas at once.

    Two bumps racing from two API replicas may name the same epoch; the planner keeps one."""
    caller.require_admin()
    current = await deps.read.epochs(tenant, model)
    epoch = (current[0]["epoch"] if current else 0) + 1
    event = EpochBumped(
        **_envelope(caller),
        tenant=tenant,
        model=ModelRef(model),
        epoch=epoch,
        reason=body.reason or f"bumped by {caller.name}",
    )
    await _publish(deps, event)
    return Accepted(event_id=event.event_id, type="epoch.bumped", epoch=epoch)


@router.post(
    "/rewarms",
    response_model=Accepted,
    status_code=status.HTTP_202_ACCEPTED,
    responses={404: {"model": Problem, "description": "no such replica"}},
)
async def rewarm_replica(deps: Deps, caller: Caller, body: RewarmReplica) -> Accepted:
    """Warm a replica again in full, even what the records say it holds (its engine restarted
    unnoticed, its cache was flushed): the planner plans its whole share at once, flagged so its
    warmer warms every item. It keeps serving meanwhile, topped up a request at a time."""
    caller.require_admin()
    rows = await deps.read.replicas(replica=body.replica)
    if not rows:
        raise HTTPException(404, f"no replica {body.replica!r}")
    row = rows[0]
    event = ReplicaRewarmRequested(
        **_envelope(caller),
        model=ModelRef(row["model"], row["model_revision"]),
        replica=body.replica,
        reason=body.reason or f"requested by {caller.name}",
    )
    await _publish(deps, event)
    return Accepted(event_id=event.event_id, type="replica.rewarm_requested")


@router.post("/deploys", response_model=Accepted, status_code=status.HTTP_202_ACCEPTED)
async def announce_deploy(deps: Deps, caller: Caller, body: AnnounceDeploy) -> Accepted:
    """A rollout of a model's weights revision and prompt revisions started or finished."""
    caller.require_admin()
    kind = DeployStarted if body.phase == "started" else DeployFinished
    event = kind(
        **_envelope(caller),
        tenant=body.tenant,
        model=ModelRef(body.model, body.revision),
        prompt_revs=list(body.prompt_revs),
    )
    await _publish(deps, event)
    return Accepted(event_id=event.event_id, type=f"deploy.{body.phase}")


@router.post("/fleet/scale", response_model=Accepted, status_code=status.HTTP_202_ACCEPTED)
async def announce_scale(deps: Deps, caller: Caller, body: AnnounceScale) -> Accepted:
    """A model's replica count changed (or is about to): the planner pre-warms the new replicas."""
    caller.require_admin()
    event = FleetScaled(
        **_envelope(caller),
        tenant=body.tenant,
        model=ModelRef(body.model, body.revision),
        from_replicas=body.from_replicas,
        to_replicas=body.to_replicas,
    )
    await _publish(deps, event)
    return Accepted(event_id=event.event_id, type="fleet.scaled")


def _envelope(caller: Principal) -> dict[str, Any]:
    """The fields every action's event shares: a new id, now, and who acted (`api:<token name>`)."""
    return {
        "event_id": new_event_id(),
        "occurred_at": datetime.now(UTC),
        "producer": f"api:{caller.name}"[:128],
    }


async def _publish(deps: ApiDeps, event: Event) -> None:
    """Publish `event` and count it; a broker that does not acknowledge is a 503. The event may still
    have landed: a retried bump names the same epoch (the planner keeps one), a retried announcement is
    a second fact the planner judges on its own."""
    try:
        await deps.events.publish(event)
    except Exception as exc:
        raise BrokerUnavailable(f"the broker did not take the {event_type(event)} event") from exc
    deps.metrics.actions.labels(type=event_type(event)).inc()


class BrokerUnavailable(Exception):
    """The event was not acknowledged (answered 503; the caller may retry)."""
