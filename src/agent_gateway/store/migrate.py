"""Alembic, driven from code: ``agent-gateway migrate`` and ``serve`` call :func:`upgrade`."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_gateway.store.engine import create_engine

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config() -> Config:
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


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Bring the database to ``revision`` (the newest by default)."""

    def run(sync_connection) -> None:  # type: ignore[no-untyped-def]
        config = alembic_config()
        config.attributes["connection"] = sync_connection
        command.upgrade(config, revision)

    async with engine.connect() as conn:
        await conn.run_sync(run)
        await conn.commit()
