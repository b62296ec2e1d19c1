"""The planner's Postgres reads and writes for fleet reactions (migration 0007): the epochs a deploy bumps,
the bumps still to publish, and cold-start alarms."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

import asyncpg
import msgspec

from warmplane.services.planner.core.deploy_epochs import EpochState, Revisions
from warmplane.shared.events import EpochBumped

log = logging.getLogger(__name__)
_json = msgspec.json.Encoder()
_bump = msgspec.json.Decoder(EpochBumped)

# Every tenant of the model: the ones with traffic (scopes) and the ones with an epoch.
EPOCH_STATES_OF_MODEL = """
SELECT t.tenant, coalesce(e.epoch, 0), e.model_revision, e.prompt_revs
FROM (SELECT tenant FROM scopes WHERE model = $1 UNION SELECT tenant FROM epochs WHERE model = $1) t
LEFT JOIN epochs e ON e.tenant = t.tenant AND e.model = $1
ORDER BY t.tenant
"""
EPOCH_STATE = """
SELECT $1::text, coalesce(e.epoch, 0), e.model_revision, e.prompt_revs
FROM (SELECT 1) one LEFT JOIN epochs e ON e.tenant = $1 AND e.model = $2
"""
# Compare-and-set: the bump applies only over the epoch it was decided from.
RECORD_BUMP = """
INSERT INTO epochs AS e (tenant, model, epoch, bumped_at, reason, event_id, model_revision, prompt_revs,
                         event)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb)
ON CONFLICT (tenant, model) DO UPDATE
SET epoch = excluded.epoch, bumped_at = excluded.bumped_at, reason = excluded.reason,
    event_id = excluded.event_id, model_revision = excluded.model_revision,
    prompt_revs = excluded.prompt_revs, event = excluded.event, published_at = NULL
WHERE e.epoch = $10
RETURNING epoch
"""
MARK_BUMP_PUBLISHED = "UPDATE epochs SET published_at = $2 WHERE event_id = $1 AND published_at IS NULL"
UNPUBLISHED_BUMPS = """
SELECT event::text FROM epochs WHERE event IS NOT NULL AND published_at IS NULL AND bumped_at < $1
ORDER BY bumped_at
"""
OPEN_ALARM = """
INSERT INTO cold_start_alarms (alarm_id, model, window_start, window_end, requests, cold_requests, fired_at)
VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING RETURNING alarm_id
"""
ALARM_PLANNED = "UPDATE cold_start_alarms SET replicas_planned = $2 WHERE alarm_id = $1"
CLEAR_ALARM = "UPDATE cold_start_alarms SET cleared_at = $2 WHERE model = $1 AND cleared_at IS NULL"


class PgFleetStore:
    """Epoch bumps of deploys and cold-start alarms. Owns no pool: the caller's lifespan does."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def epoch_states(self, model: str, tenant: str) -> list[EpochState]:
        """The epoch state of (`tenant`, `model`), or of every tenant of `model` when `tenant` is ''."""
        if tenant:
            rows = await self._pool.fetch(EPOCH_STATE, tenant, model)
        else:
            rows = await self._pool.fetch(EPOCH_STATES_OF_MODEL, model)
        return [
            EpochState(t, epoch, Revisions(rev, tuple(prompts or ())) if rev is not None else None)
            for t, epoch, rev, prompts in rows
        ]

    async def record_bump(self, bump: EpochBumped, deployed: Revisions, expected_epoch: int) -> bool:
        """Raise (`bump.tenant`, model) to `bump.epoch` for `deployed`, only if it is still at
        `expected_epoch`; True if it was raised. The bump is stored as its event, not yet published."""
        raised = await self._pool.fetchval(
            RECORD_BUMP,
            bump.tenant,
            bump.model.name,
            bump.epoch,
            bump.occurred_at,
            bump.reason,
            bump.event_id,
            deployed.model_revision,
            list(deployed.prompt_revs),
            _json.encode(bump).decode(),
            expected_epoch,
        )
        return raised is not None

    async def mark_bump_published(self, event_id: uuid.UUID, at: datetime) -> None:
        await self._pool.execute(MARK_BUMP_PUBLISHED, event_id, at)

    async def unpublished_bumps(self, before: datetime) -> list[EpochBumped]:
        """Bumps recorded before `before` that the broker never acknowledged, as they were to be published."""
        bumps = []
        for (text,) in await self._pool.fetch(UNPUBLISHED_BUMPS, before):
            try:
                bumps.append(_bump.decode(text))
            except msgspec.DecodeError:
                log.warning("a recorded epoch bump does not decode; it will not be published again")
        return bumps

    async def open_alarm(
        self,
        model: str,
        *,
        window: tuple[datetime, datetime],
        requests: int,
        cold_requests: int,
        at: datetime,
    ) -> uuid.UUID | None:
        """Record a firing of `model`'s cold-start alarm; its id, or None if one is already open."""
        alarm_id = uuid.uuid4()
        opened: uuid.UUID | None = await self._pool.fetchval(
            OPEN_ALARM, alarm_id, model, window[0], window[1], requests, cold_requests, at
        )
        return opened

    async def alarm_planned(self, alarm_id: uuid.UUID, replicas: int) -> None:
        await self._pool.execute(ALARM_PLANNED, alarm_id, replicas)

    async def clear_alarm(self, model: str, at: datetime) -> bool:
        """Close `model`'s open alarm; False if none was open."""
        status = await self._pool.execute(CLEAR_ALARM, model, at)
        return bool(int(status.split()[-1]))
