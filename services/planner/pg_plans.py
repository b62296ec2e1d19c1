"""The planner's Postgres reads and writes for warm plans: candidate prefixes of a model, catalogued
payloads, tenants' epochs, live replicas, and the idempotent record of an issued plan (0003, 0004)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

import asyncpg
import msgspec

from warmplane.services.planner.core.simple_plan import Candidate, NodeKey, PrefixNode, requests_through
from warmplane.shared.events import PrefixPayload, WarmPlanIssued

log = logging.getLogger(__name__)
_json = msgspec.json.Encoder()
_payload = msgspec.json.Decoder(PrefixPayload)

SCOPES_OF_MODEL = "SELECT scope_id FROM scopes WHERE model = $1"
NODES = """
SELECT scope_id, prefix_id, parent_id, depth, tokens FROM prefix_nodes WHERE scope_id = ANY($1::integer[])
"""
LEAF_REQUESTS = """
SELECT scope_id, prefix_id, sum(requests)::bigint FROM prefix_stats
WHERE scope_id = ANY($1::integer[]) AND bucket >= $2 GROUP BY scope_id, prefix_id
"""
CATALOGUED = "SELECT scope_id, prefix_id FROM prefix_catalog WHERE scope_id = ANY($1::integer[])"
PAYLOADS = """
SELECT c.scope_id, c.prefix_id, c.payload::text FROM prefix_catalog c
JOIN unnest($1::integer[], $2::bigint[]) AS k(scope_id, prefix_id) USING (scope_id, prefix_id)
"""
SCOPE_NAMES = "SELECT scope_id, tenant, prompt_rev FROM scopes WHERE scope_id = ANY($1::integer[])"
CURRENT_EPOCHS = "SELECT tenant, epoch FROM epochs WHERE model = $1"
LIVE_REPLICAS = """
SELECT replica_id, node FROM replicas
WHERE model = $1 AND state IN ('starting', 'loading', 'warming', 'ready') ORDER BY replica_id
"""
RECORD_PLAN = """
INSERT INTO warm_plans (plan_id, replica_id, node, model, epoch, state, items, budget_tokens, deadline,
                        issued_at, trigger_event_id)
VALUES ($1, $2, $3, $4, $5, 'issued', $6::jsonb, $7, $8, $9, $10)
ON CONFLICT (trigger_event_id, replica_id) DO NOTHING
RETURNING plan_id
"""


class PgPlanStore:
    """Reads what a plan is chosen from and records issued plans. Owns no pool: the caller's lifespan does."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def candidates(self, model: str, since_bucket: int) -> list[Candidate]:
        """Every prefix of `model` (all its tenants and prompt revisions) with requests in buckets from
        `since_bucket` on, counted through its subtree, and whether the catalogue can render it.

        Loads the model's whole trie: plans are issued once per starting replica, not per request.
        """
        async with self._pool.acquire() as connection, connection.transaction(readonly=True):
            scopes = [row[0] for row in await connection.fetch(SCOPES_OF_MODEL, model)]
            if not scopes:
                return []
            nodes = [
                PrefixNode((s, p), (s, parent) if parent is not None else None, depth, tokens)
                for s, p, parent, depth, tokens in await connection.fetch(NODES, scopes)
            ]
            leaves = {(s, p): n for s, p, n in await connection.fetch(LEAF_REQUESTS, scopes, since_bucket)}
            catalogued = {(s, p) for s, p in await connection.fetch(CATALOGUED, scopes)}
        through = requests_through(nodes, leaves)
        return [Candidate(n, through[n.key], n.key in catalogued) for n in nodes if n.key in through]

    async def payloads(self, keys: Sequence[NodeKey]) -> dict[NodeKey, PrefixPayload]:
        """The catalogued payloads of `keys`; a key whose payload is gone (swept) or unreadable is absent."""
        if not keys:
            return {}
        async with self._pool.acquire() as connection:
            rows = await connection.fetch(PAYLOADS, [k[0] for k in keys], [k[1] for k in keys])
        found: dict[NodeKey, PrefixPayload] = {}
        for scope_id, prefix_id, text in rows:
            try:
                found[(scope_id, prefix_id)] = _payload.decode(text)
            except msgspec.DecodeError:
                log.warning("catalogued payload of prefix %d (scope %d) does not decode", prefix_id, scope_id)
        return found

    async def scope_names(self, scope_ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        """(tenant, prompt revision) of each scope id."""
        rows = await self._pool.fetch(SCOPE_NAMES, list(scope_ids))
        return {row[0]: (row[1], row[2]) for row in rows}

    async def current_epochs(self, model: str) -> dict[str, int]:
        """The current epoch of each tenant of `model` that was ever bumped (the others are at 0)."""
        rows = await self._pool.fetch(CURRENT_EPOCHS, model)
        return {row[0]: row[1] for row in rows}

    async def live_replicas(self, model: str) -> list[tuple[str, str]]:
        """(replica, node) of every replica of `model` that is starting, loading, warming or ready."""
        rows = await self._pool.fetch(LIVE_REPLICAS, model)
        return [(row[0], row[1]) for row in rows]

    async def record(self, plan: WarmPlanIssued, trigger_event_id: uuid.UUID) -> bool:
        """Record `plan` as issued for `trigger_event_id`; False (and nothing written) if `plan.replica`
        already has a plan for it."""
        async with self._pool.acquire() as connection:
            inserted = await connection.fetchval(
                RECORD_PLAN,
                plan.plan_id,
                plan.replica,
                plan.node,
                plan.model.name,
                plan.epoch,
                _json.encode(plan.items).decode(),
                plan.budget_tokens,
                plan.deadline,
                plan.occurred_at,
                trigger_event_id,
            )
        return inserted is not None
