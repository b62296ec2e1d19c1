"""Running the one migration history (`migrations/`) against a database, from code or the CLI.

Alembic's environment runs its own event loop, so from async code call these through
`asyncio.to_thread`. The URL is handed in from settings; alembic.ini never holds one.
"""

from __future__ import annotations

from importlib.resources import files

from alembic import command
from alembic.config import Config


def alembic_config(sqlalchemy_url: str) -> Config:
    """An alembic config for `migrations/` and the given `postgresql+asyncpg://` URL."""
    config = Config()
    config.set_main_option("script_location", str(files("warmplane") / "migrations"))
    config.attributes["sqlalchemy_url"] = sqlalchemy_url
    return config


def upgrade(sqlalchemy_url: str, revision: str = "head") -> None:
    """Migrate the database up to `revision`."""
    command.upgrade(alembic_config(sqlalchemy_url), revision)


def downgrade(sqlalchemy_url: str, revision: str) -> None:
    """Migrate the database down to `revision` (`base` removes everything Warmplane made)."""
    command.downgrade(alembic_config(sqlalchemy_url), revision)
