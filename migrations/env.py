"""Alembic environment: the URL comes from the caller's settings (never from alembic.ini).

Connections are opened by asyncpg from the URL itself, as the services open theirs, so a URL's libpq
parameters (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`, ...) mean the same to `warmplane migrate` as to
the planner and the API. SQLAlchemy's asyncpg dialect would pass them to `asyncpg.connect` as keyword
arguments it does not take.
"""

from __future__ import annotations

import asyncio

import asyncpg
from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine


def _run(connection: Connection) -> None:
    context.configure(connection=connection, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_online(url: str) -> None:
    dsn = "postgresql://" + url.split("://", 1)[1]
    engine = create_async_engine("postgresql+asyncpg://", async_creator=lambda: asyncpg.connect(dsn))
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
