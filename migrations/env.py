"""Alembic environment: the URL comes from the caller's settings (never from alembic.ini).

Connections are opened by asyncpg from the URL itself, as the services open theirs, so a URL's libpq
parameters (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`, ...) mean the same to `warmplane migrate` as to
the planner and the API. SQLAlchemy's asyncpg dialect would pass them to `asyncpg.connect` as keyword
arguments it does not take.

The connection holds a session advisory lock (`MIGRATION_LOCK`) while it migrates, so migrations started
together (the planner pods of a release, each with its init container) run one at a time: the first
migrates, the others find the schema at head. The wait for the lock is bounded (`LOCK_WAIT_S`).
"""

from __future__ import annotations

import asyncio

import asyncpg
from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

MIGRATION_LOCK = 0x77706D6967726174
"""The advisory lock key of migrations (the bytes of "wpmigrat")."""
LOCK_WAIT_S = 600


async def _locked_connection(dsn: str) -> asyncpg.Connection:
    """A connection that holds the migration lock until it closes; raises once `LOCK_WAIT_S` passed."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(f"SET lock_timeout = '{LOCK_WAIT_S}s'")
        await connection.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
        await connection.execute("RESET lock_timeout")
    except asyncpg.LockNotAvailableError:
        await connection.close()
        raise RuntimeError(f"another migration held the migration lock for over {LOCK_WAIT_S} s") from None
    except BaseException:
        await connection.close()
        raise
    return connection


def _run(connection: Connection) -> None:
    context.configure(connection=connection, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_online(url: str) -> None:
    dsn = "postgresql://" + url.split("://", 1)[1]
    engine = create_async_engine("postgresql+asyncpg://", async_creator=lambda: _locked_connection(dsn))
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


def _main() -> None:
    url = context.config.attributes.get("sqlalchemy_url") or context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError(
            "no database URL: set WARMPLANE_POSTGRES__URL or pass one to warmplane.shared.migrate"
        )
    if context.is_offline_mode():
        context.configure(url=url, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    asyncio.run(_run_online(url))


_main()
