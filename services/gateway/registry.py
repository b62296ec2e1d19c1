"""Membership and epochs from the planner's Postgres registry, read once at start-up.

The lifecycle topic replayed from its earliest offset is the gateway's live source, but a topic keeps
events only for its retention: a replica ready for longer, or an epoch bumped before it, is no longer in
it, and a gateway that restarts would forget the replica or fall back to epoch 0 (a salt the warmer no
longer uses: every request would miss). The registry (tables `replicas` and `epochs`, written by the
planner from the same events) fills that gap: its rows are applied first, then the topic's events, of
which those older than a replica's registry state are ignored (`ReplicaTable.seed`).
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from warmplane.services.gateway.membership import Replica, ReplicaTable
from warmplane.services.gateway.tenants import EpochBook
from warmplane.shared.settings import PostgresSettings

log = logging.getLogger(__name__)
REPLICAS = """
SELECT replica_id, endpoint, model, model_revision, state, state_since FROM replicas WHERE state <> 'gone'
"""
EPOCHS = "SELECT tenant, model, epoch FROM epochs"


async def seed_from_registry(
    postgres: PostgresSettings, table: ReplicaTable, epochs: EpochBook, *, timeout_s: float
) -> tuple[int, int] | None:
    """Apply the registry's replicas and epochs; (replicas, epochs) applied, or None (logged) when the
    registry could not be read within `timeout_s`: the gateway then knows only what the topic holds."""
    try:
        async with asyncio.timeout(timeout_s):
            connection = await asyncpg.connect(postgres.asyncpg_dsn(), timeout=timeout_s)
            try:
                replicas = await connection.fetch(REPLICAS)
                bumps = await connection.fetch(EPOCHS)
            finally:
                await connection.close()
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        log.warning("the replica registry could not be read (%s): membership comes from the topic only", exc)
        return None
    for row in replicas:
        since = row["state_since"].timestamp()
        ready = row["state"] == "ready" and bool(row["endpoint"])
        replica = Replica(
            row["replica_id"], row["endpoint"], row["model"], row["model_revision"], since if ready else 0.0
        )
        table.seed(replica, ready=ready, as_of=since)
    for row in bumps:
        epochs.bump(row["tenant"], row["model"], row["epoch"])
    return len(replicas), len(bumps)
