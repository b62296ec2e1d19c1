"""Replica endpoints: state, the latest plan's progress, and the hit rate of the requests each served
over a window; one replica's detail adds what it holds by its warmer's residency report. Every token may
read replicas; a tenant token's hit and residency figures count only its tenant's requests and prefixes
(`Principal.tenant_scope`), so they say nothing about other tenants' traffic or caches. A plan mixes
tenants (its epoch, item count, tokens and hits, and when it was issued: a re-plan follows another
tenant's epoch bump), so a tenant token sees no `latest_plan`; its own warm state is the residency's
`by_tenant` and `/v1/warm-sets`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import asyncpg
from fastapi import APIRouter, HTTPException, Path, Query

from warmplane.services.api import figures
from warmplane.services.api.deps import Caller, Deps
from warmplane.services.api.routes_read import ERRORS, ModelQ, TenantQ, WindowQ
from warmplane.services.api.schemas import (
    HeldNamespace,
    PlanSummary,
    Problem,
    Replica,
    ReplicaDetail,
    ReplicaHits,
    Residency,
    Transition,
)
from warmplane.shared.events import ReplicaState
from warmplane.shared.traffic_sums import TRAFFIC_SUMS

router = APIRouter(prefix="/v1", responses=ERRORS)
_NO_TRAFFIC = (0, 0, 0, 0, 0.0, 0)


@router.get("/replicas", response_model=list[Replica])
async def replicas(
    deps: Deps,
    caller: Caller,
    *,
    model: ModelQ = None,
    state: Annotated[ReplicaState | None, Query()] = None,
    tenant: TenantQ = None,
    window_s: WindowQ = None,
) -> list[Replica]:
    """Replicas with their state, latest plan's progress and the window's hit rate."""
    scoped = caller.tenant_scope(tenant)
    rows = await deps.read.replicas(model, state)
    span = deps.window(window_s)
    hits = await deps.read.replica_hits([row["replica_id"] for row in rows], span.since_bucket, scoped)
    return [_replica(row, hits.get(row["replica_id"]), span, caller.sees_fleet) for row in rows]


@router.get("/replicas/{replica_id:path}", response_model=ReplicaDetail, responses={404: {"model": Problem}})
async def replica(
    deps: Deps,
    caller: Caller,
    replica_id: Annotated[str, Path(min_length=1, max_length=128)],
    *,
    tenant: TenantQ = None,
    window_s: WindowQ = None,
) -> ReplicaDetail:
    """One replica, the window's hit rate, its last 50 state transitions and what it holds."""
    scoped = caller.tenant_scope(tenant)
    rows = await deps.read.replicas(replica=replica_id)
    if not rows:
        raise HTTPException(404, f"no replica {replica_id!r}")
    span = deps.window(window_s)
    hits = await deps.read.replica_hits([replica_id], span.since_bucket, scoped)
    transitions = [Transition(**dict(t)) for t in await deps.read.transitions(replica_id, 50)]
    residency = _residency(await deps.read.residency(replica_id, scoped), scoped)
    return ReplicaDetail(
        **_replica(rows[0], hits.get(replica_id), span, caller.sees_fleet).model_dump(),
        transitions=transitions,
        residency=residency,
    )


def _residency(rows: list[asyncpg.Record], scoped: str | None) -> Residency | None:
    """The report's figures from its rows (`PgReadModel.residency`), counting only the namespaces of the
    `scoped` tenant when there is one. `lost` is not kept per tenant: such a read does not show it."""
    if not rows:
        return None
    held = [
        HeldNamespace(
            tenant=r["tenant"], prompt_rev=r["prompt_rev"], epoch=r["epoch"], prefixes=r["prefixes"]
        )
        for r in rows
        if r["tenant"] is not None
    ]
    return Residency(
        held=sum(namespace.prefixes for namespace in held),
        lost=rows[0]["lost"] if scoped is None else None,
        complete=rows[0]["complete"],
        reported_at=rows[0]["occurred_at"],
        by_tenant=held,
    )


def _hits(sums: asyncpg.Record | None, span: figures.Window) -> ReplicaHits:
    """The window's figures from a replica's sums (None: it served no request counted here)."""
    counted = _NO_TRAFFIC if sums is None else [sums[column] for column in TRAFFIC_SUMS]
    return ReplicaHits(since=datetime.fromtimestamp(span.start_s, UTC), **ReplicaHits.from_sums(counted))


def _replica(
    row: asyncpg.Record, sums: asyncpg.Record | None, span: figures.Window, with_plan: bool
) -> Replica:
    latest = None
    if with_plan and row["plan_id"] is not None:
        latest = PlanSummary(
            plan_id=row["plan_id"],
            state=row["plan_state"],
            epoch=row["plan_epoch"],
            items=row["plan_items"],
            items_done=row["items_done"],
            verified_hits=row["verified_hits"],
            tokens_prefilled=row["tokens_prefilled"],
            issued_at=row["issued_at"],
            deadline=row["deadline"],
            finished_at=row["finished_at"],
        )
    return Replica(
        replica=row["replica_id"],
        **{
            k: row[k]
            for k in ("node", "model", "model_revision", "endpoint", "state", "state_since", "reason")
        },
        kv_capacity_tokens=row["kv_capacity_tokens"],
        latest_plan=latest,
        hits=_hits(sums, span),
    )
