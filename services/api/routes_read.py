"""Read endpoints: models, plans, epochs, warm sets, top misses, traffic (replicas are in
`routes_replicas.py`). Every one needs a token; tenant tokens are restricted to their tenant
(`Principal.tenant_scope`) and refused fleet-wide views that would name other tenants' prefixes."""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import UTC, datetime
from typing import Annotated, Any

import asyncpg
from fastapi import APIRouter, HTTPException, Query

from warmplane.services.api import figures
from warmplane.services.api.deps import ApiDeps, Caller, Deps
from warmplane.services.api.schemas import (
    Epoch,
    EpochDetail,
    FleetChange,
    Miss,
    Name,
    Plan,
    PlanDetail,
    PlanItem,
    Problem,
    TrafficPoint,
    WarmSet,
)
from warmplane.shared.plan_states import PlanState

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "no token, or an unknown one"},
    403: {"model": Problem, "description": "the token may not read this"},
    429: {"model": Problem, "description": "over the token's rate limit (see Retry-After)"},
}
router = APIRouter(prefix="/v1", responses=ERRORS)
ModelQ = Annotated[Name | None, Query(description="a served model name")]
TenantQ = Annotated[Name | None, Query(description="a tenant; tenant tokens may name only their own")]
WindowQ = Annotated[int | None, Query(ge=60, le=30 * 86_400, description="seconds back from now")]
LimitQ = Annotated[int, Query(ge=1, le=1_000)]


@router.get("/models", response_model=list[str])
async def models(deps: Deps, caller: Caller) -> list[str]:
    """Every model with replicas, and every model with traffic (a tenant token: its own traffic)."""
    return await deps.read.models(None if caller.sees_fleet else caller.tenant)


@router.get("/plans", response_model=list[Plan])
async def plans(
    deps: Deps,
    caller: Caller,
    *,
    replica: Annotated[Name | None, Query()] = None,
    model: ModelQ = None,
    state: Annotated[PlanState | None, Query()] = None,
    limit: LimitQ = 100,
) -> list[Plan]:
    """Plans and their outcomes, newest first (reader and admin tokens: plans mix tenants)."""
    caller.require_fleet()
    return [
        _plan(row) for row in await deps.read.plans(replica=replica, model=model, state=state, limit=limit)
    ]


@router.get("/plans/{plan_id}", response_model=PlanDetail, responses={404: {"model": Problem}})
async def plan(deps: Deps, caller: Caller, plan_id: uuid.UUID) -> PlanDetail:
    """One plan with its items (payload previews for admin tokens) and failures."""
    caller.require_fleet()
    rows = await deps.read.plans(plan_id=plan_id, limit=1)
    if not rows:
        raise HTTPException(404, f"no plan {plan_id}")
    summary = _plan(rows[0])
    items, failures = await deps.read.plan_items(plan_id)
    item_list = [
        PlanItem(
            prefix_id=item["prefix_id"],
            tokens=item["tokens"],
            tenant=item.get("tenant", ""),
            prompt_rev=item.get("prompt_rev", ""),
            epoch=item["epoch"] if item.get("epoch") is not None else summary.epoch,
            preview=figures.preview(item.get("payload")) if caller.is_admin else None,
        )
        for item in items
    ]
    return PlanDetail(**summary.model_dump(), item_list=item_list, failure_list=failures)


@router.get("/epochs", response_model=list[Epoch])
async def epochs(deps: Deps, caller: Caller, tenant: TenantQ = None, model: ModelQ = None) -> list[Epoch]:
    """The current cache epoch of each (tenant, model) that has been bumped at least once."""
    rows = await deps.read.epochs(caller.tenant_scope(tenant), model)
    return [Epoch(**dict(row)) for row in rows]


@router.get("/epochs/history", response_model=EpochDetail)
async def epoch_history(
    deps: Deps,
    caller: Caller,
    *,
    tenant: Annotated[Name, Query()],
    model: Annotated[Name, Query()],
    limit: LimitQ = 100,
) -> EpochDetail:
    """(tenant, model)'s current epoch (0 if never bumped), its bumps and the model's deploys."""
    scoped = caller.tenant_scope(tenant)
    assert scoped is not None
    current = await deps.read.epochs(scoped, model)
    history = [FleetChange(**change) for change in await deps.read.epoch_history(scoped, model, limit)]
    if current:
        return EpochDetail(**dict(current[0]), history=history)
    return EpochDetail(tenant=scoped, model=model, epoch=0, bumped_at=None, reason="", history=history)


@router.get("/misses/top", response_model=list[Miss])
async def top_misses(
    deps: Deps,
    caller: Caller,
    *,
    model: ModelQ = None,
    tenant: TenantQ = None,
    window_s: WindowQ = None,
    limit: LimitQ = 50,
) -> list[Miss]:
    """The prefixes that missed most in the window, by hash; payload previews only for callers allowed to
    see that tenant."""
    span = deps.window(window_s)
    rows = await deps.read.top_misses(span.since_bucket, model, caller.tenant_scope(tenant), limit)
    visible = [(row["scope_id"], row["prefix_id"]) for row in rows if caller.may_see_payloads(row["tenant"])]
    payloads = await deps.read.payloads(visible)
    misses = []
    for row in rows:
        found = payloads.get((row["scope_id"], row["prefix_id"]))
        misses.append(
            Miss(
                **{
                    k: row[k]
                    for k in ("tenant", "model", "prompt_rev", "prefix_id", "misses", "missed_tokens")
                },
                tokens=found[1] if found else None,
                preview=figures.preview(found[0]) if found else None,
            )
        )
    return misses


@router.get("/traffic", response_model=list[TrafficPoint])
async def traffic(
    deps: Deps,
    caller: Caller,
    *,
    model: ModelQ = None,
    tenant: TenantQ = None,
    window_s: WindowQ = None,
    step_s: Annotated[int | None, Query(ge=1, le=30 * 86_400, description="seconds per point")] = None,
) -> list[TrafficPoint]:
    """Prefix hit ratio, cold starts and TTFT per tenant and model over time, from request events."""
    span = deps.window(window_s, step_s)
    rows = await deps.read.traffic(span, model, caller.tenant_scope(tenant))
    return [_traffic_point(row) for row in rows]


@router.get("/warm-sets", response_model=list[WarmSet])
async def warm_sets(
    deps: Deps,
    caller: Caller,
    *,
    model: Annotated[Name, Query()],
    tenant: TenantQ = None,
    window_s: WindowQ = None,
) -> list[WarmSet]:
    """What the live replicas of `model` were planned to hold, per tenant and epoch, and how much of the
    window's traffic passes through it. An answer is reused for `WARMPLANE_API__WARM_SETS_CACHE_S` (it
    reads every chain node of each warm scope)."""
    scoped = caller.tenant_scope(tenant)
    seconds = window_s or deps.options.default_window_s
    return list(
        await deps.warm_sets.get(
            ("warm-sets", model, scoped, seconds), lambda: _warm_sets(deps, model, scoped, seconds)
        )
    )


async def _warm_sets(deps: ApiDeps, model: str, scoped: str | None, window_s: int) -> list[WarmSet]:
    span = deps.window(window_s)
    rows = await deps.read.warm_items(model, scoped)
    groups: dict[tuple[str, str, int], list[asyncpg.Record]] = defaultdict(list)
    for row in rows:
        groups[(row["tenant"], row["prompt_rev"], row["epoch"])].append(row)
    answer = []
    for (owner, prompt_rev, epoch), items in sorted(groups.items()):
        parents = await deps.read.chain_parents(model, owner, prompt_rev)
        leaves = await deps.read.leaf_requests(model, owner, prompt_rev, span.since_bucket)
        tokens = {row["prefix_id"]: row["tokens"] for row in items}
        covered, total = figures.coverage(tokens, parents, leaves)
        answer.append(
            WarmSet(
                tenant=owner,
                model=model,
                prompt_rev=prompt_rev,
                epoch=epoch,
                prefixes=len(tokens),
                tokens=sum(tokens.values()),
                replicas=sorted({row["replica_id"] for row in items}),
                verified_replicas=sorted({row["replica_id"] for row in items if row["state"] == "verified"}),
                requests_covered=covered,
                requests=total,
                coverage=figures.ratio(covered, total),
            )
        )
    return answer


def _plan(row: asyncpg.Record) -> Plan:
    fields = dict(row)
    return Plan(
        **{k: v for k, v in fields.items() if k not in ("replica_id", "item_count", "failure_count")},
        replica=fields["replica_id"],
        items=fields["item_count"],
        failures=fields["failure_count"],
    )


def _traffic_point(row: asyncpg.Record) -> TrafficPoint:
    start, tenant, model, *sums = row
    at = datetime.fromtimestamp(start, UTC)
    return TrafficPoint(start=at, tenant=tenant, model=model, **TrafficPoint.from_sums(sums))
