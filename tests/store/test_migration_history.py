"""Every migration's downgrade undoes its upgrade: from an empty database up to the head, down to
nothing and up again gives the same schema, on both backends (migrations 0008 and 0013 share the
first NIP-98 table's definition, ``store.migrations.first_replay_table``)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from agent_gateway.store import migrate
from tests.conftest import downgrade, engine_at

pytestmark = pytest.mark.parametrize("empty_database_url", ["sqlite", "postgresql"], indirect=True)


def _schema(connection: sa.Connection) -> dict[str, object]:
    """Each table's columns, primary key and indexes, as the database describes them."""
    inspector = sa.inspect(connection)
    return {
        table: (
            [(column["name"], str(column["type"]), column["nullable"]) for column in inspector.get_columns(table)],
            inspector.get_pk_constraint(table)["constrained_columns"],
            sorted((index["name"], tuple(index["column_names"]), bool(index["unique"])) for index in inspector.get_indexes(table)),
        )
        for table in sorted(inspector.get_table_names())
    }


async def test_down_to_nothing_and_up_again_gives_the_same_schema(empty_database_url: str) -> None:
    async with engine_at(empty_database_url) as engine:
        async with engine.connect() as conn:
            head = await conn.run_sync(_schema)
        assert "nostr_auth_events" in head

        async with engine.begin() as conn:
            await conn.run_sync(downgrade, "0012")  # 0013 down: the table as 0008 made it
        async with engine.connect() as conn:
            before_0013 = await conn.run_sync(_schema)
        columns, key, indexes = before_0013["nostr_auth_events"]  # type: ignore[misc]
        assert [name for name, _, _ in columns] == ["event_id", "expires_at"] and key == ["event_id"]
        assert [name for name, _, _ in indexes] == ["ix_nostr_auth_events_expires_at"]

        async with engine.begin() as conn:
            await conn.run_sync(downgrade, "base")
        async with engine.connect() as conn:
            assert set(await conn.run_sync(_schema)) <= {"alembic_version"}

        await migrate.upgrade(engine)
        async with engine.connect() as conn:
            assert await conn.run_sync(_schema) == head
