"""Alembic, driven from code: ``agent-gateway migrate`` and ``serve`` call :func:`upgrade`.

Alembic (with Mako) is about 8 MB of modules that a gateway needs only when its
database is behind, so it is imported only then: :func:`upgrade` first reads the
database's revision with one query and returns if it is :data:`HEAD`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_gateway.store.engine import create_engine

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")
# The newest revision under migrations/versions (a test holds this to Alembic's own head).
HEAD = "0001"


def alembic_config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


async def upgrade_url(url: str) -> None:
    """Bring the database at ``url`` to the newest revision, on a connection of its own."""
    engine = create_engine(url)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


async def is_current(engine: AsyncEngine) -> bool:
    """Whether the database is at :data:`HEAD` (False for one never migrated)."""
    async with engine.connect() as conn:
        if not await conn.run_sync(lambda sync: sa.inspect(sync).has_table("alembic_version")):
            return False
        versions = (await conn.execute(sa.text("SELECT version_num FROM alembic_version"))).scalars().all()
    return versions == [HEAD]


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Bring the database to ``revision`` (the newest by default)."""
    if revision == "head" and await is_current(engine):
        return
    from alembic import command

    def run(sync_connection) -> None:  # type: ignore[no-untyped-def]
        config = alembic_config()
        config.attributes["connection"] = sync_connection
        command.upgrade(config, revision)

    async with engine.connect() as conn:
        await conn.run_sync(run)
        await conn.commit()
