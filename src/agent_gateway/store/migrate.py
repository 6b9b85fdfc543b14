"""Alembic, driven from code: ``agent-gateway migrate`` and ``serve`` call :func:`upgrade`.

Alembic (with Mako) is about 8 MB of modules that a gateway needs only when its
database is behind, so it is imported only then: :func:`upgrade` first reads the
database's revision with one query and returns if it is :data:`HEAD`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_gateway import errors
from agent_gateway.store.engine import create_engine

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")
# The newest revision under migrations/versions (a test holds this to Alembic's own head).
HEAD = "0019"
# Every revision, oldest first (a test holds this to Alembic's history too).
REVISIONS = ("0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0011", "0012", "0013", "0014", "0015", "0016", "0017", "0018", "0019")
RUN_MIGRATE = "run agent-gateway migrate"


class DatabaseProblem(errors.GatewayError):
    """The database cannot be used as it is: not at this version's schema, not a gateway
    database, or its SQLite file cannot be created."""


@dataclasses.dataclass(frozen=True)
class Schema:
    """What a database holds: a gateway schema at ``revision``, nothing, or other tables."""

    revision: str | None
    tables: tuple[str, ...]

    @property
    def is_current(self) -> bool:
        return self.revision == HEAD

    @property
    def is_empty(self) -> bool:
        return self.revision is None and not self.tables

    @property
    def is_foreign(self) -> bool:
        """Tables, but no gateway schema: somebody else's database."""
        return self.revision is None and bool(self.tables)

    @property
    def is_newer(self) -> bool:
        return self.revision is not None and self.revision not in REVISIONS

    def require_current(self) -> None:
        """Refuse, with what to do, unless this is a gateway database at :data:`HEAD`."""
        if self.is_current:
            return
        if self.is_empty:
            raise DatabaseProblem(f"the database has no gateway schema: {RUN_MIGRATE}")
        if self.is_foreign:
            raise DatabaseProblem(f"the database is not an agent-gateway database (it has {self._some_tables()})")
        if self.is_newer:
            raise DatabaseProblem(
                f"the database is at revision {self.revision}, newer than this agent-gateway knows ({HEAD})"
            )
        raise DatabaseProblem(f"the database is at revision {self.revision}; this version needs {HEAD}: {RUN_MIGRATE}")

    def require_migratable(self, force: bool) -> None:
        """Refuse a database ``migrate`` must not touch: another's (unless ``force``), or a newer one."""
        if self.is_foreign and not force:
            raise DatabaseProblem(
                f"the database is not empty and not an agent-gateway database (it has {self._some_tables()}); "
                "pass --force to add the gateway's tables to it"
            )
        if self.is_newer:
            self.require_current()

    def _some_tables(self) -> str:
        shown = ", ".join(self.tables[:5])
        more = len(self.tables) - 5
        return f"tables {shown}" + (f" and {more} more" if more > 0 else "")


async def schema(engine: AsyncEngine) -> Schema:
    """Read which schema the database holds, changing nothing."""

    def read(sync) -> Schema:  # type: ignore[no-untyped-def]
        tables = tuple(sorted(sa.inspect(sync).get_table_names()))
        if "alembic_version" not in tables:
            return Schema(None, tables)
        versions = sync.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
        return Schema(versions[0] if len(versions) == 1 else ",".join(versions) or None, tables)

    async with engine.connect() as conn:
        return await conn.run_sync(read)


def create_sqlite_file(url: str) -> None:
    """Create a new SQLite database file readable by its owner only (its -wal and -shm take
    the same mode from SQLite): it holds password and Token digests."""
    database = sa.make_url(url).database
    if not url.startswith("sqlite") or not database or database == ":memory:":
        return
    try:
        os.close(os.open(database, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        pass
    except OSError as exc:
        raise DatabaseProblem(f"cannot create the SQLite database file {database}: {exc.strerror}") from None


async def migrate(engine: AsyncEngine, *, force: bool = False) -> str:
    """Create or upgrade the schema as ``agent-gateway migrate`` does; say what was done."""
    before = await schema(engine)
    before.require_migratable(force)
    if before.is_current:
        return f"up to date (revision {HEAD})"
    await upgrade(engine)
    if before.revision is None:
        return f"created the schema (revision {HEAD})"
    return f"upgraded from revision {before.revision} to {HEAD}"


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
    return (await schema(engine)).is_current


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
