"""The planner's Postgres store for ingestion: one transaction per batch, Postgres sums the counters.

The hot path speaks asyncpg directly: a batch's requests and misses are copied (binary COPY) one row
per event into a temporary table, and one call of `warmplane_ingest_events` (migrations 0006, 0009,
0016, 0017) sums them per key (and a request's per replica; a request at a leaf its own batch adds is
kept in that leaf's chain row instead) and applies them with the offsets, the ledger, the batch's new
chain nodes (one packed value a scope: `shared/chain_nodes.py`) and the catalog (bench/ingest_bench.py
measures it; bench/batch_write_bench.py splits a batch's cost by part). A batch's counts, its
partitions' next offsets and its ledger of event ids commit in one transaction, so a crash anywhere
leaves either all of a batch or none of it, and the consumer resumes exactly after the last batch that
committed.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain, repeat

import asyncpg
import msgspec

from warmplane.services.planner.core.ingest_batch import IngestBatch, Scope
from warmplane.services.planner.core.recent_ids import pack_ids, unpack_ids
from warmplane.services.planner.pg_residency import record_residency
from warmplane.shared.events import (
    EpochBumped,
    Event,
    ReplicaEvent,
    ReplicaLost,
    WarmFinished,
    WarmProgressed,
    event_type,
)
from warmplane.shared.plan_states import plan_state

_json = msgspec.json.Encoder()
log = logging.getLogger(__name__)

INGEST_EVENTS = "SELECT warmplane_ingest_events(" + ", ".join(f"${n}" for n in range(1, 16)) + ")"
"""Offsets (fenced), ledger, the staged counts, new chain nodes and catalog (its latest: migration 0017)."""
STAGED_COUNTS = "warmplane_batch_counts"
STAGE_COUNTS = f"""
CREATE TEMP TABLE IF NOT EXISTS {STAGED_COUNTS} (
    miss      boolean NOT NULL,
    scope_id  integer NOT NULL,
    prefix_id bigint  NOT NULL,
    at        double precision NOT NULL,
    tokens    integer NOT NULL,
    cached    integer,
    ttft      double precision,
    replica   text,
    added     boolean NOT NULL
) ON COMMIT DELETE ROWS
"""
"""A batch's requests and misses, one row each, for `warmplane_ingest_events` to sum: in this session
only, emptied at every commit. `at` is occurred_at in Unix seconds; `tokens` a request's prompt tokens
or a miss's missed tokens; `cached`, `ttft`, `replica` (the one that served it) and `added` (its leaf is a
node the batch adds: `RequestColumns.leaf_added`) are a request's."""
_STAGED_COLUMNS = ("miss", "scope_id", "prefix_id", "at", "tokens", "cached", "ttft", "replica", "added")
FENCED_SQLSTATE = "WP001"
_DEADLOCK_RETRIES = 3
STORED_OFFSETS = """
SELECT topic, partition, next_offset FROM ingest_offsets
WHERE group_id = $1 AND (topic, partition) IN (SELECT * FROM unnest($2::text[], $3::int[]))
"""
RECENT_LEDGER = """
SELECT event_ids FROM ingest_ledger WHERE topic = $1 AND partition = $2
ORDER BY first_offset DESC LIMIT $3
"""
RECORD_TRANSITION = """
INSERT INTO replica_transitions (event_id, replica_id, state, occurred_at, reason)
VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING
"""
# Lifecycle events may arrive out of order across producers: the latest occurrence decides the state;
# an endpoint or capacity is kept from whichever event carried one, the latest such when several did.
UPSERT_REPLICA = """
INSERT INTO replicas AS r (replica_id, node, model, model_revision, endpoint, state, state_since,
                           kv_capacity_tokens, reason, last_event_id, heard_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (replica_id) DO UPDATE SET
    heard_at = greatest(r.heard_at, excluded.heard_at),
    endpoint = CASE WHEN excluded.endpoint <> ''
                         AND (r.endpoint = '' OR r.state_since <= excluded.state_since)
                    THEN excluded.endpoint ELSE r.endpoint END,
    kv_capacity_tokens = CASE WHEN excluded.kv_capacity_tokens IS NOT NULL
                                   AND (r.kv_capacity_tokens IS NULL OR r.state_since <= excluded.state_since)
                              THEN excluded.kv_capacity_tokens ELSE r.kv_capacity_tokens END,
    node = CASE WHEN r.state_since <= excluded.state_since THEN excluded.node ELSE r.node END,
    model = CASE WHEN r.state_since <= excluded.state_since THEN excluded.model ELSE r.model END,
    model_revision = CASE WHEN r.state_since <= excluded.state_since
                          THEN excluded.model_revision ELSE r.model_revision END,
    state = CASE WHEN r.state_since <= excluded.state_since THEN excluded.state ELSE r.state END,
    reason = CASE WHEN r.state_since <= excluded.state_since THEN excluded.reason ELSE r.reason END,
    last_event_id = CASE WHEN r.state_since <= excluded.state_since
                         THEN excluded.last_event_id ELSE r.last_event_id END,
    state_since = greatest(r.state_since, excluded.state_since)
"""
# A heartbeat only says the replica's warmer is alive: it changes no state.
RECORD_HEARD = """
UPDATE replicas AS r SET heard_at = greatest(r.heard_at, h.at)
FROM unnest($1::text[], $2::timestamptz[]) AS h(replica_id, at) WHERE r.replica_id = h.replica_id
"""
RECORD_FLEET_CHANGE = """
INSERT INTO fleet_changes (event_id, type, tenant, model, revision, occurred_at, body)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb) ON CONFLICT DO NOTHING
"""
RAISE_EPOCH = """
INSERT INTO epochs AS e (tenant, model, epoch, bumped_at, reason, event_id) VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tenant, model) DO UPDATE
SET epoch = excluded.epoch, bumped_at = excluded.bumped_at, reason = excluded.reason,
    event_id = excluded.event_id
WHERE e.epoch < excluded.epoch
"""
PLAN_PROGRESSED = """
UPDATE warm_plans SET state = 'warming', items_done = $2, tokens_prefilled = $3
WHERE plan_id = $1 AND state IN ('issued', 'warming')
"""
PLAN_FINISHED = """
UPDATE warm_plans
SET state = $2, items_done = $3, tokens_prefilled = $4, verified_hits = $5, failures = $6::jsonb,
    finished_at = $7
WHERE plan_id = $1 AND finished_at IS NULL
"""


@dataclass(slots=True)
class PartitionSlice:
    """What a batch consumed from one partition: its offsets, the ids of the events it counts, and the
    stored next offset the writer expects to advance from (None: the group never read this partition).
    Ids are the 128-bit integers of the UUIDs."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    expected_next: int | None
    event_ids: list[int]


class Fenced(Exception):
    """`partitions` are stored past where this batch starts (another consumer counted them, or this very
    batch committed before its answer was lost); nothing was written."""

    def __init__(self, partitions: set[tuple[str, int]]) -> None:
        super().__init__(f"partitions taken over by another consumer: {sorted(partitions)}")
        self.partitions = partitions


class PgIngestStore:
    """Applies ingestion batches to Postgres. Owns no pool: the caller's lifespan does, and creates it
    with `init=PgIngestStore.prepare_session`."""

    def __init__(self, pool: asyncpg.Pool, group_id: str, bucket_seconds: int) -> None:
        self._pool = pool
        self._group_id = group_id
        self._bucket_seconds = bucket_seconds
        """Width of a statistics bucket: Postgres buckets each event's `occurred_at` by it."""
        self._scope_ids: dict[Scope, int] = {}

    @staticmethod
    async def prepare_session(connection: asyncpg.Connection) -> None:
        """Create the session's staging table for the batches' counts: pass as the pool's `init`
        (a write on a session without it raises asyncpg's `UndefinedTableError`)."""
        await connection.execute(STAGE_COUNTS)

    async def write(self, slices: Sequence[PartitionSlice], batch: IngestBatch) -> None:
        """Commit `batch` with its partitions' new positions and ledger, atomically.

        Raises `Fenced` (and writes nothing) if any partition's stored position is not the one its
        slice expects (another consumer moved it); raises asyncpg's `DataError` if Postgres refuses
        a value. A deadlock with another planner's batch is retried, at most `_DEADLOCK_RETRIES` times.
        """
        async with self._pool.acquire() as connection:
            # Scopes are created outside the batch's transaction: harmless if it rolls back, and the
            # id cache then never holds an id that was rolled back.
            await self.scope_ids(connection, batch.scopes())
            for attempt in range(_DEADLOCK_RETRIES + 1):
                try:
                    await self._write_once(connection, slices, batch)
                    return
                except asyncpg.DeadlockDetectedError:
                    if attempt == _DEADLOCK_RETRIES:
                        raise
                    log.warning("batch deadlocked with another planner's; retrying (%d)", attempt + 1)
                except asyncpg.PostgresError as exc:
                    if exc.sqlstate == FENCED_SQLSTATE:
                        raise Fenced({(s.topic, s.partition) for s in slices}) from None
                    raise

    async def _write_once(
        self, connection: asyncpg.Connection, slices: Sequence[PartitionSlice], batch: IngestBatch
    ) -> None:
        async with connection.transaction():
            await self._ingest(connection, slices, batch)
            await self._record_fleet(connection, batch)

    async def _ingest(
        self, connection: asyncpg.Connection, slices: Sequence[PartitionSlice], batch: IngestBatch
    ) -> None:
        """Offsets, ledger, counters, paths and catalog. Call inside a transaction: the staged rows
        are deleted at its commit."""
        ids = self._scope_ids  # holds the batch's scopes: `write` and `rejected` fetched them
        scope_id = ids.__getitem__
        requests, misses = batch.requests, batch.misses
        # One row per event, which the function sums: copied, because asyncpg encodes each element
        # of an array parameter after an abstract-class check (measured: 3 times the cost of COPY).
        rows = chain(
            zip(
                repeat(False),
                map(scope_id, requests.scopes),
                requests.leaves,
                requests.seconds,
                requests.prompt_tokens,
                requests.cached_tokens,
                requests.ttft_ms,
                requests.replicas,
                requests.leaf_added,
            ),
            zip(
                repeat(True),
                map(scope_id, misses.scopes),
                misses.prefixes,
                misses.seconds,
                misses.missed_tokens,
                repeat(None),
                repeat(None),
                repeat(None),
                repeat(False),
            ),
        )
        await connection.copy_records_to_table(STAGED_COUNTS, records=rows, columns=_STAGED_COLUMNS)
        chains = batch.chains
        catalog = batch.catalog
        await connection.execute(
            INGEST_EVENTS,
            self._group_id,
            [s.topic for s in slices],
            [s.partition for s in slices],
            [s.expected_next for s in slices],
            [s.first_offset for s in slices],
            [s.last_offset for s in slices],
            [pack_ids(s.event_ids) for s in slices],
            self._bucket_seconds,
            [ids[scope] for scope in chains],
            [nodes.pack() for nodes in chains.values()],
            [ids[n[0]] for n in catalog],
            [n[1] for n in catalog],
            [_json.encode(e.payload).decode() for e in catalog.values()],
            [e.tokens for e in catalog.values()],
            [e.seen_at for e in catalog.values()],
        )

    async def positions(
        self, partitions: Sequence[tuple[str, int]], window: int
    ) -> dict[tuple[str, int], tuple[int, list[uuid.UUID]]]:
        """For each partition this group has counted from: its next offset, and up to `window` of the
        most recently counted ids (oldest first). Partitions never counted from are absent."""
        async with self._pool.acquire() as connection:
            rows = await connection.fetch(
                STORED_OFFSETS, self._group_id, [p[0] for p in partitions], [p[1] for p in partitions]
            )
            found: dict[tuple[str, int], tuple[int, list[uuid.UUID]]] = {}
            for topic, partition, next_offset in rows:
                ids: list[uuid.UUID] = []
                async with connection.transaction():
                    async for (packed,) in connection.cursor(RECENT_LEDGER, topic, partition, window):
                        ids[:0] = unpack_ids(packed)
                        if len(ids) >= window:
                            break
                found[(topic, partition)] = (next_offset, ids[-window:])
        return found

    async def rejected(
        self, batch_of: Callable[[list[Event]], IngestBatch], events: list[Event]
    ) -> list[int]:
        """The indexes of the events Postgres refuses to store, found by bisection in transactions
        that are always rolled back (nothing is written)."""
        async with self._pool.acquire() as connection:
            await self.scope_ids(connection, batch_of(events).scopes())
            return await self._bisect(connection, batch_of, events, 0)

    async def _bisect(
        self,
        connection: asyncpg.Connection,
        batch_of: Callable[[list[Event]], IngestBatch],
        events: list[Event],
        offset: int,
    ) -> list[int]:
        try:
            async with connection.transaction():
                batch = batch_of(events)
                await self._ingest(connection, [], batch)
                await self._record_fleet(connection, batch)
                raise _DryRun
        except _DryRun:
            return []
        except asyncpg.DataError:
            if len(events) == 1:
                return [offset]
        half = len(events) // 2
        return await self._bisect(connection, batch_of, events[:half], offset) + await self._bisect(
            connection, batch_of, events[half:], offset + half
        )

    async def scope_ids(self, connection: asyncpg.Connection, scopes: set[Scope]) -> dict[Scope, int]:
        """The ids of `scopes`, creating the missing ones. Cached: a scope's id never changes.

        Created, then read, in two statements (outside a transaction, each its own snapshot): when two
        planners create one scope at once, the second's insert waits for the first's and does nothing,
        and a read in that same statement, its snapshot taken before the first committed, would miss
        the row."""
        missing = [scope for scope in scopes if scope not in self._scope_ids]
        if missing:
            columns = ([s[0] for s in missing], [s[1] for s in missing], [s[2] for s in missing])
            await connection.execute(
                """
                INSERT INTO scopes (tenant, model, prompt_rev)
                SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) ON CONFLICT DO NOTHING
                """,
                *columns,
            )
            rows = await connection.fetch(
                """
                SELECT s.scope_id, s.tenant, s.model, s.prompt_rev FROM scopes s
                JOIN unnest($1::text[], $2::text[], $3::text[]) AS w(t, m, p)
                  ON (s.tenant, s.model, s.prompt_rev) = (w.t, w.m, w.p)
                """,
                *columns,
            )
            for row in rows:
                self._scope_ids[(row[1], row[2], row[3])] = row[0]
        return {scope: self._scope_ids[scope] for scope in scopes}

    async def _record_fleet(self, connection: asyncpg.Connection, batch: IngestBatch) -> None:
        """Replica transitions and heartbeats, fleet changes, plan results and residency reports: few per
        batch, one statement each, but for replica transitions, which a fleet scaling out brings by the
        hundred: each of their two statements runs for all of them in one pipelined round."""
        if batch.replica_events:
            await self._record_replicas(connection, batch.replica_events)
        if batch.heartbeats:
            beats = list(batch.heartbeats.values())
            await connection.execute(RECORD_HEARD, [b.replica for b in beats], [b.occurred_at for b in beats])
        for change in batch.fleet_changes:
            await connection.execute(
                RECORD_FLEET_CHANGE,
                change.event_id,
                event_type(change),
                change.tenant,
                change.model.name,
                change.model.revision,
                change.occurred_at,
                _json.encode(change).decode(),
            )
            if isinstance(change, EpochBumped):
                await connection.execute(
                    RAISE_EPOCH,
                    change.tenant,
                    change.model.name,
                    change.epoch,
                    change.occurred_at,
                    change.reason,
                    change.event_id,
                )
        for result in batch.plan_results:
            await self._record_result(connection, result)
        await record_residency(connection, batch.residency.values())

    async def _record_result(
        self, connection: asyncpg.Connection, result: WarmProgressed | WarmFinished
    ) -> None:
        """Move the plan's row: `warming` while it progresses, then its outcome (module doc of 0004). The
        first outcome stands: a later one (a warmer reading old plans again and refusing them as
        expired) does not overwrite it."""
        if isinstance(result, WarmProgressed):
            await connection.execute(
                PLAN_PROGRESSED, result.plan_id, result.items_done, result.tokens_prefilled
            )
            return
        await connection.execute(
            PLAN_FINISHED,
            result.plan_id,
            plan_state(result),
            result.items_done,
            result.tokens_prefilled,
            result.verified_hits,
            _json.encode(result.failures).decode(),
            result.occurred_at,
        )

    async def _record_replicas(self, connection: asyncpg.Connection, events: Sequence[ReplicaEvent]) -> None:
        """Each event's transition, then each one's upsert of its replica, in batch order: two replicas'
        rows are independent, and one replica's events are applied in the order they came."""
        await connection.executemany(
            RECORD_TRANSITION, [(e.event_id, e.replica, e.STATE, e.occurred_at, e.reason) for e in events]
        )
        await connection.executemany(
            UPSERT_REPLICA,
            [
                (
                    e.replica,
                    e.node,
                    e.model.name,
                    e.model.revision,
                    e.endpoint,
                    e.STATE,
                    e.occurred_at,
                    e.kv_capacity_tokens,
                    e.reason,
                    e.event_id,
                    # Heard from its warmer; a loss is the planner's word, which says nothing of the replica.
                    None if isinstance(e, ReplicaLost) else e.occurred_at,
                )
                for e in events
            ],
        )

    async def sweep(self, *, ledger_before: datetime, catalog_before: datetime) -> tuple[int, int]:
        """Drop ledger rows and catalog payloads older than the retention cut-offs; return the counts.

        Ledger rows only serve to rebuild a partition's window of recent ids when it changes hands.
        """
        async with self._pool.acquire() as connection:
            ledger = await connection.execute(
                "DELETE FROM ingest_ledger WHERE ingested_at < $1", ledger_before
            )
            catalog = await connection.execute(
                "DELETE FROM prefix_catalog WHERE last_seen < $1", catalog_before
            )
        return int(ledger.split()[-1]), int(catalog.split()[-1])


class _DryRun(Exception):
    """Raised inside a transaction to roll it back on purpose."""
