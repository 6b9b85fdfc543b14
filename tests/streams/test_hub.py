"""Wake-ups of Message streams across processes, shown with two stores on one database.

Each store stands for one gateway process: the one that writes a Message is
never the one whose stream must wake. On PostgreSQL the wake-up is the
transaction's NOTIFY; on SQLite, the Hub's poll of the log table (the
datagrams of ``store.notifications`` reach only the process running the loops).
"""

from __future__ import annotations

import dataclasses

import pytest

from agent_gateway import config
from agent_gateway.messages import service as messages
from agent_gateway.store.engine import Store
from agent_gateway.streams.hub import Hub
from agent_gateway.users import service as users

CEILING_S = 300


async def test_a_message_written_by_another_process_wakes_the_users_streams(
    settings: config.Settings, database_url: str
) -> None:
    reader, writer = Store(database_url), Store(database_url)
    hub = Hub(reader, dataclasses.replace(settings, http_workers=2))
    try:
        if reader.dialect == "postgresql":
            reader.listen()
        hub.start()
        async with writer.transaction() as conn:
            user = await users.admit(conn)
            other = await users.admit(conn)
        subscription = hub.subscribe(user.id)
        bystander = hub.subscribe(other.id)
        async with writer.transaction() as conn:
            await messages.send(conn, user.id, "hello")
        assert await subscription.wait(CEILING_S)
        # Its first poll wakes every stream once (see Hub._poll); from then on, only
        # the streams of the User whose log grew.
        await bystander.wait(0)
        async with writer.transaction() as conn:
            await messages.send(conn, user.id, "again")
        assert await subscription.wait(CEILING_S)
        assert not await bystander.wait(0)
        async with writer.transaction() as conn:
            await messages.send(conn, other.id, "and you")
        assert await bystander.wait(CEILING_S)
        hub.unsubscribe(subscription)
        hub.unsubscribe(bystander)
        assert len(hub) == 0
    finally:
        await hub.close()
        await reader.close()
        await writer.close()


async def test_closing_the_hub_wakes_every_stream(settings: config.Settings, database_url: str) -> None:
    store = Store(database_url)
    hub = Hub(store, settings)
    try:
        async with store.transaction() as conn:
            user = await users.admit(conn)
        subscription = hub.subscribe(user.id)
        await hub.close()
        assert hub.closed
        assert await subscription.wait(CEILING_S)
    finally:
        await store.close()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_process_is_not_woken_twice_by_its_own_notify(database_url: str) -> None:
    # Woken at commit already, the writer's subscribers would read a second time.
    reader, writer = Store(database_url), Store(database_url)
    try:
        reader.listen()
        async with writer.transaction() as conn:
            user = await users.admit(conn)
            other = await users.admit(conn)
        own = reader.subscribe(messages.channel(user.id))
        theirs = reader.subscribe(messages.channel(other.id))
        async with writer.transaction() as conn:
            await messages.send(conn, other.id, "listening?")
        # Woken, so the listener listens (it wakes every channel once as it connects).
        assert await theirs.wait(CEILING_S)
        await own.wait(0)
        async with reader.transaction() as conn:
            await messages.send(conn, user.id, "mine")
        assert await own.wait(0)  # at commit
        async with writer.transaction() as conn:
            await messages.send(conn, other.id, "theirs")
        # NOTIFYs arrive in commit order: once the writer's has, the reader's own would have.
        assert await theirs.wait(CEILING_S)
        assert not await own.wait(0)
    finally:
        await reader.close()
        await writer.close()
