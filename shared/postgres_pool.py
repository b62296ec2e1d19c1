"""The asyncpg pool every service opens from its `PostgresSettings`: one place maps the settings'
sizes and timeouts onto the pool, so a service cannot forget one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg

from warmplane.shared.settings import PostgresSettings


async def open_pool(
    postgres: PostgresSettings, *, init: Callable[[asyncpg.Connection], Awaitable[None]] | None = None
) -> asyncpg.Pool:
    """`new_pool`, started. Raises what asyncpg raises when Postgres cannot be reached."""
    pool: asyncpg.Pool = await new_pool(postgres, init=init)
    return pool


def new_pool(
    postgres: PostgresSettings, *, init: Callable[[asyncpg.Connection], Awaitable[None]] | None = None
) -> asyncpg.Pool:
    """A pool not yet started (`await pool` starts it; the caller closes it), made on the running event
    loop, so parts can be wired to it before any I/O: at most `pool_size` connections, each opened within
    `connect_timeout_s`, every statement bounded by `statement_timeout_ms` (by the client and the server),
    and what a connection whose peer vanished holds released after about `peer_timeout_s` (session
    settings, set on each new connection rather than in the startup packet, which poolers such as PgBouncer
    refuse, and again after each release's reset); `init` runs on each new connection after them."""
    session = "; ".join(f"SET {name} = {value}" for name, value in postgres.session_settings().items())

    async def prepare(connection: asyncpg.Connection) -> None:
        await connection.execute(session)
        if init is not None:
            await init(connection)

    async def reset(connection: asyncpg.Connection) -> None:
        # asyncpg's own reset on release ends in RESET ALL, which took every session setting back to the
        # server's defaults after a connection's first use: a cut-off planner then held its locks for hours.
        await connection.execute(f"{connection.get_reset_query()}\n{session}")

    return asyncpg.create_pool(
        postgres.asyncpg_dsn(),
        min_size=1,
        max_size=postgres.pool_size,
        timeout=postgres.connect_timeout_s,
        command_timeout=postgres.statement_timeout_ms / 1000,
        init=prepare,
        reset=reset,
    )
