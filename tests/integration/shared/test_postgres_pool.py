"""The pool every service opens keeps its session settings on every use of a connection, not only the first:
asyncpg's reset on release (RESET ALL) would otherwise take them back to the server's defaults, and with them
the bound on how long a cut-off peer's transaction holds its locks."""

from __future__ import annotations

from pydantic import SecretStr

from warmplane.shared.postgres_pool import open_pool
from warmplane.shared.settings import PostgresSettings


async def test_a_connection_keeps_its_session_settings_after_it_is_released_and_taken_again(
    migrated_database: str,
) -> None:
    settings = PostgresSettings(url=SecretStr(migrated_database), pool_size=1, peer_timeout_s=7)
    pool = await open_pool(settings)
    try:
        for use in range(3):  # one connection (pool_size 1), taken again after each release
            async with pool.acquire() as connection:
                shown = {
                    name: await connection.fetchval(f"SHOW {name}")
                    for name in ("idle_in_transaction_session_timeout", "statement_timeout")
                }
                assert shown == {"idle_in_transaction_session_timeout": "7s", "statement_timeout": "30s"}, use
                await connection.execute("SELECT pg_advisory_lock(42)")  # what the reset still undoes
        async with pool.acquire() as connection:
            assert await connection.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
    finally:
        await pool.close()
