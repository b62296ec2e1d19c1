"""The API's read model: the planner's tables, read through one asyncpg pool (migrations 0001-0010).

Every query filters by tenant in SQL when the caller is restricted to one (`tenant` is None for every
tenant), so a tenant's rows never reach the process for another tenant's caller. Times are
`timestamptz`; windows are whole statistics buckets (`bucket_seconds`, the planner's).
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import msgspec

from warmplane.services.api.figures import Window
from warmplane.shared.chain_nodes import parent_of, unpack, unpack_leaves
from warmplane.shared.events import LIVE_REPLICA_STATES
from warmplane.shared.traffic_sums import TRAFFIC_SUMS

REPLICAS = """
SELECT r.replica_id, r.node, r.model, r.model_revision, r.endpoint, r.state, r.state_since,
       r.kv_capacity_tokens, r.reason,
       p.plan_id, p.state AS plan_state, p.epoch AS plan_epoch, jsonb_array_length(p.items) AS plan_items,
       p.items_done, p.verified_hits, p.tokens_prefilled, p.issued_at, p.deadline, p.finished_at
FROM replicas r
LEFT JOIN LATERAL (
    SELECT * FROM warm_plans w WHERE w.replica_id = r.replica_id ORDER BY w.issued_at DESC LIMIT 1
) p ON true
WHERE ($1::text IS NULL OR r.model = $1) AND ($2::text IS NULL OR r.state = $2)
  AND ($3::text IS NULL OR r.replica_id = $3)
ORDER BY r.model, r.replica_id
"""
REPLICA_HITS = """
SELECT h.replica, sum(h.requests)::bigint AS requests, sum(h.cold_requests)::bigint AS cold_requests,
       sum(h.prompt_tokens)::bigint AS prompt_tokens, sum(h.cached_tokens)::bigint AS cached_tokens,
       sum(h.ttft_ms_sum)::float8 AS ttft_ms_sum, sum(h.ttft_count)::bigint AS ttft_count
FROM replica_stats h JOIN scopes s USING (scope_id)
WHERE h.replica = ANY($1::text[]) AND h.bucket >= $2 AND ($3::text IS NULL OR s.tenant = $3)
GROUP BY h.replica
"""
TRANSITIONS = """
SELECT state, occurred_at, reason FROM replica_transitions WHERE replica_id = $1
ORDER BY occurred_at DESC LIMIT $2
"""
# The replica's residency report if it is on the replica's latest start: one row per namespace it holds
# (of `tenant` only, unless that is None), or one row of NULL namespace when none is; no row without a report.
RESIDENCY = """
SELECT r.occurred_at, r.lost, r.complete, n.tenant, n.prompt_rev, n.epoch, n.prefixes
FROM replica_residency r
JOIN LATERAL (
    SELECT t.event_id FROM replica_transitions t
    WHERE t.replica_id = r.replica_id AND t.state = 'starting' ORDER BY t.occurred_at DESC LIMIT 1
) s ON s.event_id = r.incarnation
LEFT JOIN LATERAL (
    SELECT h.entry->>0 AS tenant, h.entry->>1 AS prompt_rev, (h.entry->>2)::bigint AS epoch,
           sum(jsonb_array_length(h.entry->3))::bigint AS prefixes
    FROM jsonb_array_elements(r.held) AS h(entry)
    WHERE $2::text IS NULL OR h.entry->>0 = $2
    GROUP BY 1, 2, 3
) n ON true
WHERE r.replica_id = $1
ORDER BY n.tenant, n.prompt_rev, n.epoch
"""
PLANS = """
SELECT plan_id, replica_id, node, model, epoch, state, jsonb_array_length(items) AS item_count,
       budget_tokens, deadline, issued_at, published_at, items_done, tokens_prefilled, verified_hits,
       jsonb_array_length(failures) AS failure_count, finished_at, trigger_event_id,
       event->>'empty_reason' AS empty_reason
FROM warm_plans
WHERE ($1::text IS NULL OR replica_id = $1) AND ($2::text IS NULL OR model = $2)
  AND ($3::text IS NULL OR state = $3) AND ($4::uuid IS NULL OR plan_id = $4)
ORDER BY issued_at DESC LIMIT $5
"""
PLAN_ITEMS = "SELECT items::text, failures::text FROM warm_plans WHERE plan_id = $1"
EPOCHS = """
SELECT tenant, model, epoch, bumped_at, reason FROM epochs
WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR model = $2) ORDER BY model, tenant
"""
EPOCH_HISTORY = """
SELECT event_id, type, occurred_at, revision, body::text FROM fleet_changes
WHERE model = $1 AND (tenant = $2 OR tenant = '')
  AND type IN ('epoch.bumped', 'deploy.started', 'deploy.finished')
ORDER BY occurred_at DESC LIMIT $3
"""
TOP_MISSES = """
SELECT s.tenant, s.model, s.prompt_rev, m.scope_id, m.prefix_id,
       sum(m.misses)::bigint AS misses, sum(m.missed_tokens)::bigint AS missed_tokens
FROM miss_stats m JOIN scopes s USING (scope_id)
WHERE m.bucket >= $1 AND ($2::text IS NULL OR s.model = $2) AND ($3::text IS NULL OR s.tenant = $3)
GROUP BY s.tenant, s.model, s.prompt_rev, m.scope_id, m.prefix_id
ORDER BY misses DESC, missed_tokens DESC, m.prefix_id LIMIT $4
"""
PAYLOADS = """
SELECT c.scope_id, c.prefix_id, c.payload::text, c.tokens FROM prefix_catalog c
JOIN unnest($1::integer[], $2::bigint[]) AS k(scope_id, prefix_id) USING (scope_id, prefix_id)
"""
# The sweep moves a bucket's counts from `prefix_stats` to `scope_traffic` in one statement: each request
# is in exactly one of the two (`services/planner/pg_retention.py`).
_SUMMED = ", ".join(("scope_id", "bucket", *TRAFFIC_SUMS))
TRAFFIC = f"""
SELECT (p.bucket / $2) * $2 * $5 AS step_start, s.tenant, s.model,
       sum(p.requests)::bigint, sum(p.cold_requests)::bigint, sum(p.prompt_tokens)::bigint,
       sum(p.cached_tokens)::bigint, sum(p.ttft_ms_sum)::float8, sum(p.ttft_count)::bigint
FROM (
    SELECT {_SUMMED} FROM prefix_stats WHERE bucket >= $1
    UNION ALL SELECT {_SUMMED} FROM scope_traffic WHERE bucket >= $1
) p JOIN scopes s USING (scope_id)
WHERE ($3::text IS NULL OR s.model = $3) AND ($4::text IS NULL OR s.tenant = $4)
GROUP BY 1, s.tenant, s.model ORDER BY 1, s.model, s.tenant
"""  # noqa: S608 - composed of constants
WARM_ITEMS = """
SELECT w.replica_id, w.plan_id, w.state, w.issued_at, i.item->>'tenant' AS tenant,
       (i.item->>'prefix_id')::bigint AS prefix_id, (i.item->>'tokens')::bigint AS tokens,
       coalesce(i.item->>'prompt_rev', '') AS prompt_rev,
       coalesce((i.item->>'epoch')::bigint, w.epoch) AS epoch
FROM replicas r
JOIN warm_plans w ON w.replica_id = r.replica_id AND w.issued_at >= r.state_since - interval '1 hour'
CROSS JOIN LATERAL jsonb_array_elements(w.items) AS i(item)
WHERE r.state = ANY($3::text[]) AND r.model = $1
  AND ($2::text IS NULL OR i.item->>'tenant' = $2)
"""
CHAINS = """
SELECT c.nodes FROM prefix_chains c JOIN scopes s USING (scope_id)
WHERE s.model = $1 AND s.tenant = $2 AND s.prompt_rev = $3
ORDER BY c.written_at DESC
"""
"""A scope's stored chains, newest first (`shared/chain_nodes.py` packs each row)."""
LEAF_REQUESTS = """
SELECT p.prefix_id, sum(p.requests)::bigint FROM prefix_stats p JOIN scopes s USING (scope_id)
WHERE s.model = $1 AND s.tenant = $2 AND s.prompt_rev = $3 AND p.bucket >= $4 GROUP BY p.prefix_id
"""
CHAIN_LEAVES = """
SELECT c.leaves FROM prefix_chains c JOIN scopes s USING (scope_id)
WHERE s.model = $1 AND s.tenant = $2 AND s.prompt_rev = $3 AND c.leaves <> ''::bytea
"""
"""A scope's requests counted with the leaves their batches added (migration 0017)."""
# The fleet's models are no tenant's secret (replicas list them); models only in scopes are a tenant's.
MODELS = """
SELECT DISTINCT model FROM replicas
UNION SELECT DISTINCT model FROM scopes WHERE $1::text IS NULL OR tenant = $1
ORDER BY 1
"""

_json = msgspec.json.Decoder()


class PgReadModel:
    """Reads for the API. Every method takes a `tenant` restriction where rows belong to tenants."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def ping(self) -> None:
        await self._pool.fetchval("SELECT 1")

    async def replicas(
        self, model: str | None = None, state: str | None = None, replica: str | None = None
    ) -> list[asyncpg.Record]:
        return list(await self._pool.fetch(REPLICAS, model, state, replica))

    async def replica_hits(
        self, replicas: list[str], since_bucket: int, tenant: str | None
    ) -> dict[str, asyncpg.Record]:
        """The request sums (`requests`, `cold_requests`, `prompt_tokens`, `cached_tokens`,
        `ttft_ms_sum`, `ttft_count`) of each of `replicas` from bucket `since_bucket` on, counting only
        `tenant`'s requests unless it is None. A replica that served none in the window is absent."""
        rows = await self._pool.fetch(REPLICA_HITS, replicas, since_bucket, tenant)
        return {row["replica"]: row for row in rows}

    async def transitions(self, replica: str, limit: int) -> list[asyncpg.Record]:
        return list(await self._pool.fetch(TRANSITIONS, replica, limit))

    async def residency(self, replica: str, tenant: str | None) -> list[asyncpg.Record]:
        """The rows of `RESIDENCY`: [] when the replica has no report on its latest start."""
        return list(await self._pool.fetch(RESIDENCY, replica, tenant))

    async def plans(
        self,
        *,
        replica: str | None = None,
        model: str | None = None,
        state: str | None = None,
        plan_id: uuid.UUID | None = None,
        limit: int = 100,
    ) -> list[asyncpg.Record]:
        return list(await self._pool.fetch(PLANS, replica, model, state, plan_id, limit))

    async def plan_items(self, plan_id: uuid.UUID) -> tuple[list[dict[str, Any]], list[Any]]:
        row = await self._pool.fetchrow(PLAN_ITEMS, plan_id)
        if row is None:
            return [], []
        return _json.decode(row[0]), _json.decode(row[1])

    async def epochs(self, tenant: str | None, model: str | None) -> list[asyncpg.Record]:
        return list(await self._pool.fetch(EPOCHS, tenant, model))

    async def epoch_history(self, tenant: str, model: str, limit: int) -> list[dict[str, Any]]:
        rows = await self._pool.fetch(EPOCH_HISTORY, model, tenant, limit)
        return [
            {
                "event_id": row["event_id"],
                "type": row["type"],
                "occurred_at": row["occurred_at"],
                "revision": row["revision"],
                "epoch": _json.decode(row["body"]).get("epoch"),
                "reason": _json.decode(row["body"]).get("reason", ""),
            }
            for row in rows
        ]

    async def top_misses(
        self, since_bucket: int, model: str | None, tenant: str | None, limit: int
    ) -> list[asyncpg.Record]:
        return list(await self._pool.fetch(TOP_MISSES, since_bucket, model, tenant, limit))

    async def payloads(self, keys: list[tuple[int, int]]) -> dict[tuple[int, int], tuple[Any, int]]:
        """Catalogued payloads (decoded JSON) and their token counts, by (scope id, prefix id)."""
        if not keys:
            return {}
        rows = await self._pool.fetch(PAYLOADS, [k[0] for k in keys], [k[1] for k in keys])
        return {(row[0], row[1]): (_json.decode(row[2]), row[3]) for row in rows}

    async def traffic(self, window: Window, model: str | None, tenant: str | None) -> list[asyncpg.Record]:
        return list(
            await self._pool.fetch(
                TRAFFIC, window.since_bucket, window.step_buckets, model, tenant, window.bucket_seconds
            )
        )

    async def warm_items(self, model: str, tenant: str | None) -> list[asyncpg.Record]:
        return list(await self._pool.fetch(WARM_ITEMS, model, tenant, sorted(LIVE_REPLICA_STATES)))

    async def chain_parents(self, model: str, tenant: str, prompt_rev: str) -> dict[int, int | None]:
        """Each stored node's parent; where a node is stored twice, the oldest row's word."""
        parents: dict[int, int | None] = {}
        for (packed,) in await self._pool.fetch(CHAINS, model, tenant, prompt_rev):
            nodes = unpack(packed)
            parents.update(zip(nodes.ids, map(parent_of, nodes.ids, nodes.parents), strict=True))
        return parents

    async def leaf_requests(
        self, model: str, tenant: str, prompt_rev: str, since_bucket: int
    ) -> dict[int, int]:
        """Requests per leaf of one scope from `since_bucket` on: `prefix_stats`'s, and those its chain rows
        count at the leaves they add."""
        rows = await self._pool.fetch(LEAF_REQUESTS, model, tenant, prompt_rev, since_bucket)
        requests = {row[0]: row[1] for row in rows}
        for (packed,) in await self._pool.fetch(CHAIN_LEAVES, model, tenant, prompt_rev):
            for leaf, bucket in unpack_leaves(packed):
                if bucket >= since_bucket:
                    requests[leaf] = requests.get(leaf, 0) + 1
        return requests

    async def models(self, tenant: str | None) -> list[str]:
        """Models with replicas, and those with statistics of `tenant` (None: any tenant's)."""
        return [row[0] for row in await self._pool.fetch(MODELS, tenant)]
