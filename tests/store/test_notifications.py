"""On PostgreSQL a NOTIFY goes out only when a process other than the sender's listens
(store.notifications.PG_NOTIFY, migration 0019), and no wake-up is lost when one starts to.

A process's own subscribers are woken at commit; the listening processes register their
connection in notification_listeners. Every statement that sends a NOTIFY sends it through the
gate: a transaction's last statement, the one carrying rows (engine.carry), a Message's (in a
transaction and alone) and a Decision's. SQLite sends its datagrams as before (the table stays
empty there): see tests/messages and tests/decisions for the wake-ups across processes on both.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import pytest
import sqlalchemy as sa

from agent_gateway import clock
from agent_gateway.decisions import service as decisions
from agent_gateway.messages import service as messages
from agent_gateway.signals import service as signals
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.store import direct, engine, notifications
from agent_gateway.store.engine import Store, libpq_dsn
from agent_gateway.store.queries import decisions as decisions_queries
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.users import service as users

pytestmark = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)

# A ceiling for what another connection sees, never a duration.
CEILING_S = 120.0
identity = SigningIdentity(keys.generate_pem("ed25519"))


async def admit(store: Store) -> str:
    async with store.transaction() as conn:
        return (await users.admit(conn)).id


async def in_a_transaction(store: Store, tag: str) -> list[str]:
    async with store.transaction() as conn:
        engine.notify(conn, tag)
    return [tag]


async def carried(store: Store, tag: str) -> list[str]:
    async with store.transaction() as conn:
        await signal_queries.insert_many(
            conn, [(str(uuid.uuid4()), "some.kind", {}, clock.now_iso())], wake=tag, late=True
        )
    return [tag]


async def a_message_in_a_transaction(store: Store, tag: str) -> list[str]:
    user_id = await admit(store)
    async with store.transaction() as conn:
        await messages.send(conn, user_id, tag)
    return [messages.channel(user_id)]


async def a_message_alone(store: Store, tag: str) -> list[str]:
    user_id = await admit(store)
    await messages.Writer(store).receive(user_id, tag)
    return [messages.channel(user_id), signals.CHANNEL]


async def a_decision(store: Store, tag: str) -> list[str]:
    store.watched = frozenset({decisions_queries.CHANNEL})
    await decisions.Publisher(store, identity).publish(tag)
    return [decisions_queries.CHANNEL]


class Observer:
    """A connection listening for the deployment's NOTIFY, registered as another process's
    listener only once :meth:`register` is called."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.channels: list[str] = []
        self._arrived = asyncio.Event()

    @classmethod
    async def connect(cls, database_url: str) -> Observer:
        observer = cls(await asyncpg.connect(libpq_dsn(database_url)))
        await observer.conn.add_listener(notifications.PG_CHANNEL, observer._received)
        return observer

    def _received(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self.channels.append(payload.partition(" ")[2])
        self._arrived.set()

    async def register(self) -> None:
        await self.conn.execute("SELECT agent_gateway_listen('observer')")

    async def until(self, channel: str) -> list[str]:
        """The channels received before ``channel``, once it arrives."""
        async with asyncio.timeout(CEILING_S):
            while channel not in self.channels:
                self._arrived.clear()
                await self._arrived.wait()
        return self.channels[: self.channels.index(channel)]


async def listening(store: Store) -> None:
    """Start ``store``'s listener and return once it is registered (it then wakes every channel)."""
    probe = store.subscribe("probe")
    store.listen()
    async with asyncio.timeout(CEILING_S):
        await probe.wait(None)
    store.unsubscribe("probe", probe)


async def listeners(store: Store) -> dict[str, int]:
    """The registered listeners' connections, by origin (one each)."""
    rows = await store.fetch(_LISTENERS)
    by_origin = {origin: pid for pid, origin in rows}
    assert len(by_origin) == len(rows)
    return by_origin


_LISTENERS = direct.Query(sa.text("SELECT pid, origin FROM notification_listeners"))


@pytest.mark.parametrize(
    "write", [in_a_transaction, carried, a_message_in_a_transaction, a_message_alone, a_decision],
    ids=lambda write: write.__name__,
)
async def test_a_process_listening_alone_sends_no_notify_and_sends_once_another_listens(
    store: Store, database_url: str, write: Callable[[Store, str], Awaitable[list[str]]]
) -> None:
    await listening(store)
    observer = await Observer.connect(database_url)
    try:
        assert list(await listeners(store)) == [store.origin]
        await write(store, "alone")  # its own listener does not count
        await observer.register()
        woken = await write(store, "beside another")
        await in_a_transaction(store, "last")
        # Delivered in commit order: what the first write sent would have come first.
        assert sorted(await observer.until("last")) == sorted(woken)
    finally:
        await observer.conn.close()


async def test_a_listener_registering_waits_for_the_notifier_that_found_none(store: Store, database_url: str) -> None:
    """The notifier holds the gate's lock shared until it commits: the registration (which takes
    it alone) commits after, and the sweep that follows it reads the notifier's writes."""
    notifier = await asyncpg.connect(libpq_dsn(database_url))
    try:
        async with notifier.transaction():
            sent = await notifier.fetchval("SELECT agent_gateway_notify($1, ARRAY['someone c'])", notifications.PG_CHANNEL)
            assert sent == 0
            store.listen()
            await waiting_on_the_gate(store)
            assert await listeners(store) == {}
        async with asyncio.timeout(CEILING_S):
            while store.origin not in await listeners(store):
                await asyncio.sleep(0.01)
    finally:
        await notifier.close()


async def waiting_on_the_gate(store: Store) -> None:
    """Return once some backend of ``store``'s database waits for an advisory lock."""
    query = direct.Query(sa.text(
        "SELECT count(*) FROM pg_locks AS l JOIN pg_database AS d ON d.oid = l.database "
        "WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()"
    ))
    async with asyncio.timeout(CEILING_S):
        while not (await store.fetch(query))[0][0]:
            await asyncio.sleep(0.01)


async def test_the_gate_reads_the_listeners_registered_while_its_statement_waited(
    store: Store, database_url: str
) -> None:
    """A statement's snapshot is taken when it starts; the gate reads the listeners with one of
    its own, after it holds the lock, so a listener registered meanwhile is notified."""
    holder = await asyncpg.connect(libpq_dsn(database_url))
    notifier = await asyncpg.connect(libpq_dsn(database_url))
    observer = await Observer.connect(database_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT pg_advisory_xact_lock(42)")
            sending = asyncio.create_task(notifier.fetchval(
                "SELECT agent_gateway_notify($1, ARRAY['someone waited']) "
                "FROM (SELECT pg_advisory_xact_lock(42) OFFSET 0) AS w",
                notifications.PG_CHANNEL,
            ))
            await waiting_on_the_gate(store)
            await observer.register()
        assert await sending == 1
        await observer.until("waited")
    finally:
        for conn in (holder, notifier, observer.conn):
            await conn.close()


async def test_a_listener_reconnected_registers_again_and_the_rows_of_connections_gone_are_dropped(store: Store) -> None:
    await listening(store)
    async with store.read() as conn:
        await conn.execute(sa.text("INSERT INTO notification_listeners (pid, origin) VALUES (-1, 'gone')"))
        async with asyncio.timeout(CEILING_S):  # the listener's check of its connection drops it
            while "gone" in await listeners(store):
                await asyncio.sleep(0.05)
        first = (await listeners(store))[store.origin]
        await conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
    async with asyncio.timeout(CEILING_S):  # registered anew, the row of the connection gone dropped
        while [(pid != first, origin) for pid, origin in await store.fetch(_LISTENERS)] != [(True, store.origin)]:
            await asyncio.sleep(0.05)
