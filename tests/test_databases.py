"""The suite's PostgreSQL databases (``tests/conftest.py``, ``Databases``): a copy a test is done
with is reset to the template's state for the next test, or dropped where it cannot be."""

from __future__ import annotations

import asyncpg
import pytest

from tests.conftest import POSTGRES_URL, Databases


async def fetch(url: str, sql: str) -> object:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


async def execute(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for sql in statements:
            await conn.execute(sql)
    finally:
        await conn.close()


DECIDE = "INSERT INTO decisions (statement, jws, created_at) VALUES ('s', 'j', 'now')"
WRITE = (
    "INSERT INTO users (id, attributes, created_at) VALUES ('ada', '{}', 'now')",
    "INSERT INTO users (id, attributes, created_at) VALUES ('bob', '{}', 'now')",
    "DELETE FROM users WHERE id = 'bob'",
    DECIDE,
    "SELECT nextval('ledger_draws')",
    "VACUUM users",
)


async def test_a_copy_given_back_is_reset_to_the_templates_state(postgres_databases: Databases) -> None:
    with postgres_databases.url(migrated=True) as url:
        name = url.rpartition("/")[2]
        await execute(url, *WRITE)
        held = await asyncpg.connect(url)  # a session the test left open
        try:
            assert await postgres_databases.reset(name) is True
            with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError)):
                await held.fetchval("SELECT 1")  # ended by the reset
        finally:
            held.terminate()
        assert await fetch(url, "SELECT count(*) FROM users") == 0
        assert await fetch(url, "SELECT pg_relation_size('users')") == 0
        assert await fetch(url, "SELECT nextval('ledger_draws')") == 1
        await execute(url, DECIDE)
        assert await fetch(url, "SELECT seq FROM decisions") == 1
        assert await fetch(url, "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'users'") == 0
        assert await fetch(url, "SELECT count(*) FROM alembic_version") == 1


@pytest.mark.parametrize(
    "change",
    [
        "ALTER TABLE users ADD COLUMN nickname TEXT",
        "ALTER TABLE signals SET (autovacuum_enabled = false)",
        "CREATE INDEX ix_users_created ON users (created_at)",
        f"{WRITE[0]}; ANALYZE users",
        "CREATE TABLE invoices (id INTEGER PRIMARY KEY)",
        "UPDATE alembic_version SET version_num = '0003'",
        "ALTER SEQUENCE ledger_draws INCREMENT BY 2",
        "DROP TABLE alembic_version",
    ],
)
async def test_a_copy_whose_schema_changed_is_not_reused(postgres_databases: Databases, change: str) -> None:
    with postgres_databases.url(migrated=True) as url:
        name = url.rpartition("/")[2]
        await execute(url, change)
        assert await postgres_databases.reset(name) is False


async def test_a_copy_closed_to_connections_is_not_reused(postgres_databases: Databases) -> None:
    with postgres_databases.url(migrated=True) as url:
        name = url.rpartition("/")[2]
        await execute(POSTGRES_URL, f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        assert await postgres_databases.reset(name) is False
