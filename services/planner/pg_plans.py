"""The planner's Postgres reads and writes for warm plans: a model's statistics, catalogued payloads,
tenants' epochs, live replicas and what they hold (0010: residency reports), and the idempotent record of
an issued plan (0003-0005)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime

import asyncpg
import msgspec

from warmplane.services.planner.core.chains_read import ChainsNeeded, LeafCounts
from warmplane.services.planner.plan_choice import HeldItem, LiveReplica, ModelStatistics
from warmplane.services.planner.plans import Unplanned
from warmplane.services.planner.policy.replica_plan import NodeKey
from warmplane.shared.chain_nodes import unpack, unpack_leaves
from warmplane.shared.events import LIVE_REPLICA_STATES, ModelRef, PrefixPayload, WarmFinished, WarmPlanIssued

log = logging.getLogger(__name__)
_json = msgspec.json.Encoder()
_payload = msgspec.json.Decoder(PrefixPayload)
_plan = msgspec.json.Decoder(WarmPlanIssued)

SCOPES_OF_MODEL = "SELECT scope_id FROM scopes WHERE model = $1"
CHAINS_NEWEST_FIRST = """
SELECT scope_id, nodes, leaves FROM prefix_chains WHERE scope_id = ANY($1::integer[]) ORDER BY written_at DESC
"""
LEAF_REQUESTS = """
WITH recent AS (
    SELECT scope_id, prefix_id, max(bucket) AS latest, sum(requests) AS requests FROM prefix_stats
    WHERE scope_id = ANY($1::integer[]) AND bucket >= $2 AND requests > 0
    GROUP BY scope_id, prefix_id
    ORDER BY latest DESC, requests DESC, scope_id, prefix_id
    LIMIT $3
)
SELECT s.scope_id, s.prefix_id, s.bucket, s.requests
FROM prefix_stats s JOIN recent USING (scope_id, prefix_id)
WHERE s.bucket >= $2 AND s.requests > 0
ORDER BY recent.latest DESC, recent.requests DESC, s.scope_id, s.prefix_id, s.bucket
"""
"""The `prefix_stats` counts of the `$3` leaves most recently counted there (all of them if NULL), most
recent first: the requests at leaves stored before their batch (the others are in `prefix_chains.leaves`)."""
CATALOGUED = """
SELECT c.scope_id, c.prefix_id FROM prefix_catalog c
JOIN unnest($1::integer[], $2::bigint[]) AS k(scope_id, prefix_id) USING (scope_id, prefix_id)
"""
_CHAIN_ROWS_PREFETCH = 4
"""Rows of `prefix_chains` fetched at a time: each holds a batch's new nodes of a scope (up to megabytes)."""
GROUP_OFFSETS = "SELECT topic, partition, next_offset FROM ingest_offsets WHERE group_id = $1"
PAYLOADS = """
SELECT c.scope_id, c.prefix_id, c.payload::text FROM prefix_catalog c
JOIN unnest($1::integer[], $2::bigint[]) AS k(scope_id, prefix_id) USING (scope_id, prefix_id)
"""
SCOPE_NAMES = "SELECT scope_id, tenant, prompt_rev FROM scopes WHERE scope_id = ANY($1::integer[])"
CURRENT_EPOCHS = "SELECT tenant, epoch FROM epochs WHERE model = $1"
LIVE_REPLICAS = """
SELECT replica_id, node, model_revision, state, kv_capacity_tokens FROM replicas
WHERE model = $1 AND state = ANY($2::text[]) ORDER BY replica_id
"""
# What each replica asked holds (`PgPlanStore.held_by`): the items of its verified plans from the one
# answering its latest start on (one clock, the planner's, orders them; a partial plan's held items are not
# known by name: left out) or, once its warmer reported on that start, the report's prefixes and the items
# of those plans that finished after it (the warmer's clock, both). `> ALL` of no report is true. One
# statement for every replica a pass plans (a thousand starting at once were a thousand round trips).
HELD = """
WITH latest AS (
    SELECT a.replica_id, t.event_id FROM unnest($1::text[]) AS a(replica_id)
    CROSS JOIN LATERAL (
        SELECT event_id FROM replica_transitions
        WHERE replica_id = a.replica_id AND state = 'starting' ORDER BY occurred_at DESC LIMIT 1
    ) t
), answered AS (
    SELECT p.replica_id, p.issued_at FROM warm_plans p
    JOIN latest l ON p.trigger_event_id = l.event_id AND p.replica_id = l.replica_id
), report AS (
    SELECT r.replica_id, r.occurred_at, r.held FROM replica_residency r
    JOIN latest l ON r.incarnation = l.event_id AND r.replica_id = l.replica_id
)
SELECT p.replica_id, (i.item->>'prefix_id')::bigint, coalesce(i.item->>'tenant', ''),
       coalesce((i.item->>'epoch')::bigint, p.epoch)
FROM warm_plans p JOIN answered a ON p.replica_id = a.replica_id
CROSS JOIN LATERAL jsonb_array_elements(p.items) AS i(item)
WHERE p.state = 'verified' AND p.issued_at >= a.issued_at
  AND p.finished_at > ALL (SELECT r.occurred_at FROM report r WHERE r.replica_id = p.replica_id)
UNION
SELECT r.replica_id, id::bigint, h.entry->>0, (h.entry->>2)::bigint
FROM report r CROSS JOIN LATERAL jsonb_array_elements(r.held) AS h(entry)
CROSS JOIN LATERAL jsonb_array_elements_text(h.entry->3) AS id
"""
RECORD_PLANS = """
INSERT INTO warm_plans (plan_id, replica_id, node, model, epoch, state, items, budget_tokens, deadline,
                        issued_at, trigger_event_id, event)
SELECT plan_id, replica_id, node, model, epoch, 'issued', items::jsonb, budget_tokens, deadline, issued_at,
       trigger_event_id, event::jsonb
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::bigint[],
            $8::timestamptz[], $9::timestamptz[], $10::uuid[], $11::text[])
     AS p(plan_id, replica_id, node, model, epoch, items, budget_tokens, deadline, issued_at,
          trigger_event_id, event)
ON CONFLICT (trigger_event_id, replica_id) DO NOTHING
RETURNING plan_id
"""
FINISHED_AT = "SELECT plan_id, finished_at FROM warm_plans WHERE plan_id = ANY($1::uuid[])"
MARK_PUBLISHED = """
UPDATE warm_plans SET published_at = $2 WHERE plan_id = ANY($1::uuid[]) AND published_at IS NULL
"""
UNPUBLISHED = """
SELECT event::text FROM warm_plans
WHERE published_at IS NULL AND event IS NOT NULL AND issued_at < $1 AND deadline > $2
ORDER BY issued_at
"""
UNPLANNED_STARTS = """
SELECT r.replica_id, r.node, r.model, r.model_revision, s.event_id
FROM replicas r
JOIN LATERAL (
    SELECT event_id, occurred_at FROM replica_transitions t
    WHERE t.replica_id = r.replica_id AND t.state = 'starting'
    ORDER BY occurred_at DESC LIMIT 1
) s ON true
WHERE r.state IN ('starting', 'loading') AND s.occurred_at >= $1 AND s.occurred_at < $2
  AND NOT EXISTS (
      SELECT 1 FROM warm_plans p WHERE p.trigger_event_id = s.event_id AND p.replica_id = r.replica_id
  )
ORDER BY s.occurred_at
"""


class PgPlanStore:
    """Reads what a plan is chosen from and records issued plans. Owns no pool: the caller's lifespan does."""

    def __init__(self, pool: asyncpg.Pool, group_id: str | None = None) -> None:
        self._pool = pool
        self._group_id = group_id
        """The planner's ingest group: a statistics read says where its partitions stood (`positions`)."""

    async def statistics(
        self, model: str, since_bucket: int, max_nodes: int | None = None
    ) -> ModelStatistics:
        """The request counts per leaf and bucket of `model`'s scopes from `since_bucket` on (all its
        tenants and prompt revisions with traffic since), the prefixes on the counted leaves' chains, and
        which of those the catalogue can render.

        The counts are `prefix_stats`'s and those the chain rows keep (`core.chains_read.LeafCounts`). With
        `max_nodes`, only the leaves most recently counted whose chains hold at most that many prefixes
        together (`core.chains_read.bounded`): what a plan holds is then bounded by a setting, not by the
        history (up to `max_nodes` leaves from each of the two places are weighed). The chains are
        streamed, newest row first, and only the nodes on them kept (`core.chains_read.ChainsNeeded`): a
        model's stored rows hold every node its traffic passed in the detail retention. Plans are issued
        per replica start or fleet change, not per request.

        With the store's `group_id`, one snapshot holds the read and the group's positions: which of the
        planner's committed batches the counts include (`kept_reads.py` absorbs the rest).
        """
        async with (
            self._pool.acquire() as connection,
            connection.transaction(readonly=True, isolation="repeatable_read"),
        ):
            positions = None
            if self._group_id is not None:
                rows = await connection.fetch(GROUP_OFFSETS, self._group_id)
                positions = {(topic, partition): offset for topic, partition, offset in rows}
            scopes = [row[0] for row in await connection.fetch(SCOPES_OF_MODEL, model)]
            stored = await connection.fetch(LEAF_REQUESTS, scopes, since_bucket, max_nodes)
            counted = LeafCounts(stored, since_bucket, max_nodes)
            chains = await self._chains(connection, scopes, counted)
            leaves = counted.leaves()  # most recent first
            if not leaves:  # no scope, or none with traffic since
                return ModelStatistics([], [], set(), positions)
            prefixes, taken = chains.bounded(leaves, max_nodes)
            counts = counted.counts([leaf for leaf in leaves if leaf in taken])
            catalogued = {
                (s, p)
                for s, p in await connection.fetch(
                    CATALOGUED, [scope for scope, _ in prefixes], [p.prefix_id for _, p in prefixes]
                )
            }
        return ModelStatistics(prefixes, counts, catalogued, positions)

    @staticmethod
    async def _chains(connection: asyncpg.Connection, scopes: list[int], counted: LeafCounts) -> ChainsNeeded:
        """The stored prefixes on the chains of the leaves `counted` holds, and of those the rows count
        (module doc of `core.chains_read`)."""
        needed = ChainsNeeded(counted)  # unordered: the read sorts the leaves once, after the stream
        rows = connection.cursor(CHAINS_NEWEST_FIRST, scopes, prefetch=_CHAIN_ROWS_PREFETCH)
        async for scope, nodes, leaves in rows:
            if leaves:
                needed.want(scope, counted.take(scope, unpack_leaves(leaves)))
            if needed.needs(scope):
                needed.take(scope, unpack(nodes))
        return needed

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

    async def live_replicas(self, model: str) -> list[LiveReplica]:
        """Every replica of `model` that is starting, loading, warming or ready, by name."""
        rows = await self._pool.fetch(LIVE_REPLICAS, model, sorted(LIVE_REPLICA_STATES))
        return [LiveReplica(*row) for row in rows]

    async def held(self, replica: str) -> list[HeldItem]:
        """`held_by` of `replica` alone."""
        return (await self.held_by([replica]))[replica]

    async def held_by(self, replicas: Sequence[str]) -> dict[str, list[HeldItem]]:
        """The prefixes each of `replicas` holds since its latest start, each once, in the (tenant, epoch)
        it was warmed in; [] before its start's plan verified or its warmer reported on that start.

        Without a residency report on its latest start: the items of its verified plans (an eviction since
        goes unseen). With one: the report's prefixes (what the engine's KV events say is still there)
        and the items of the plans verified after it. A report that is not `complete` may leave out
        prefixes still held; planning then chooses a few of them again, which takes a little of the plan's
        budget and a cached request each at the warmer. Accepted: the gap is short (the warmer settles it
        with a probe), and counting only what the report shows never takes an evicted prefix for held.
        """
        held: dict[str, list[HeldItem]] = {replica: [] for replica in replicas}
        for replica, *item in await self._pool.fetch(HELD, list(held)):
            held[replica].append(HeldItem(*item))
        return held

    async def record(self, plans: Sequence[tuple[WarmPlanIssued, uuid.UUID]]) -> set[uuid.UUID]:
        """Record each plan as issued for its trigger event, in one statement (a scale-up of a thousand
        replicas is one commit, not a thousand); the ids of those recorded. A plan whose replica already
        has one for its trigger is not (nothing of it is written)."""
        columns: list[list[object]] = [[] for _ in range(11)]
        for plan, trigger_event_id in plans:
            row = (
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
                _json.encode(plan).decode(),
            )
            for column, value in zip(columns, row, strict=True):
                column.append(value)
        rows = await self._pool.fetch(RECORD_PLANS, *columns) if plans else []
        return {row["plan_id"] for row in rows}

    async def mark_published(self, plan_ids: Sequence[uuid.UUID], at: datetime) -> None:
        """The broker acknowledged the plans `plan_ids` by `at`."""
        if plan_ids:
            await self._pool.execute(MARK_PUBLISHED, list(plan_ids), at)

    async def unpublished(self, *, issued_before: datetime, alive_at: datetime) -> list[WarmPlanIssued]:
        """Plans recorded before `issued_before` that the broker never acknowledged and whose deadline is
        after `alive_at`, as they were to be published."""
        rows = await self._pool.fetch(UNPUBLISHED, issued_before, alive_at)
        plans = []
        for (text,) in rows:
            try:
                plans.append(_plan.decode(text))
            except msgspec.DecodeError:
                log.warning("a recorded plan does not decode; it will not be published again")
        return plans

    async def standing(self, results: Sequence[WarmFinished]) -> list[WarmFinished]:
        """Those of `results` (committed) that are their plan's recorded outcome: the first one for a plan
        stands, a later one was not written (pg_store), and the row's `finished_at` tells them apart."""
        rows = await self._pool.fetch(FINISHED_AT, list({result.plan_id for result in results}))
        finished_at = {plan_id: at for plan_id, at in rows}
        return [result for result in results if finished_at.get(result.plan_id) == result.occurred_at]

    async def unplanned_starts(self, *, since: datetime, before: datetime) -> list[Unplanned]:
        """Replicas still starting or loading whose latest start, between `since` and `before`, has no
        plan (its batch committed, then the planner stopped before planning it)."""
        rows = await self._pool.fetch(UNPLANNED_STARTS, since, before)
        return [Unplanned(r[0], r[1], ModelRef(r[2], r[3]), r[4]) for r in rows]
