"""Refusing to start on a database that is not at the migration head (migrations run once, before)."""

from __future__ import annotations

import asyncpg
from alembic.script import ScriptDirectory

from warmplane.shared.migrate import alembic_config


class SchemaNotReady(RuntimeError):
    """The database's schema is not the one this code was written for."""


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("postgresql+asyncpg://unused")).get_current_head()
    if head is None:
        raise SchemaNotReady("the migration history is empty")
    return head


async def require_schema_at_head(pool: asyncpg.Pool) -> None:
    """Raise `SchemaNotReady`, saying what to run, unless the database is at the migration head."""
    expected = head_revision()
    try:
        current = await pool.fetchval("SELECT version_num FROM alembic_version")
    except asyncpg.UndefinedTableError:
        current = None
    if current != expected:
        raise SchemaNotReady(
            f"database schema is at {current or 'nothing'}, this planner needs {expected}: "
            "run `warmplane migrate` first"
        )
