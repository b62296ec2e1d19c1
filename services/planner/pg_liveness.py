"""The planner's Postgres reads for replica liveness (migration 0013): who should be heard and when each was,
and which of some replicas are recorded gone."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from warmplane.services.planner.core.liveness import Heard
from warmplane.shared.events import HEARTBEATING_STATES

HEARD_REPLICAS = """
SELECT replica_id, node, model, model_revision, endpoint, heard_at FROM replicas WHERE state = ANY($1::text[])
"""
GONE_AMONG = """
SELECT replica_id, node, model, model_revision, endpoint, heard_at, state_since FROM replicas
WHERE replica_id = ANY($1::text[]) AND state = 'gone'
"""


class PgLivenessStore:
    """Reads only: the registry's rows are written by ingestion. Owns no pool: the caller's lifespan does."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def heard_replicas(self) -> list[Heard]:
        """Every replica in a state whose warmer sends heartbeats, with when it was last heard."""
        rows = await self._pool.fetch(HEARD_REPLICAS, sorted(HEARTBEATING_STATES))
        return [Heard(*row) for row in rows]

    async def gone_among(self, replicas: Sequence[str]) -> list[tuple[Heard, datetime]]:
        """Those of `replicas` recorded gone, each with since when."""
        rows = await self._pool.fetch(GONE_AMONG, list(replicas))
        return [(Heard(*row[:6]), row[6]) for row in rows]
