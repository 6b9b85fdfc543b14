"""The store: transactions, on_commit, notify/subscribe, migrations = tables (store/engine.py, migrate.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import sqlite3
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, config, deployment
from agent_gateway.gateway import Gateway
from agent_gateway.signals import service as signals
from agent_gateway.store import direct, engine, migrate, sqlite, tables, wal
from agent_gateway.store.engine import Store
from tests import served


async def insert_user(conn: AsyncConnection, user_id: str) -> None:
    await conn.execute(tables.users.insert().values(id=user_id, attributes={}, created_at=clock.now_iso()))


async def user_ids(store: Store) -> list[str]:
    async with store.read() as conn:
        return list((await conn.execute(sa.select(tables.users.c.id).order_by(tables.users.c.id))).scalars())


class Boom(Exception):
    pass


async def test_a_committed_transaction_is_durable(store: Store) -> None:
    async with store.transaction() as conn:
        await insert_user(conn, "00000000-0000-4000-8000-000000000001")
    assert await user_ids(store) == ["00000000-0000-4000-8000-000000000001"]


async def test_a_rolled_back_transaction_leaves_nothing(store: Store) -> None:
    with pytest.raises(Boom):
        async with store.transaction() as conn:
            await insert_user(conn, "00000000-0000-4000-8000-000000000001")
            await insert_user(conn, "00000000-0000-4000-8000-000000000002")
            raise Boom
    assert await user_ids(store) == []
    # The connection went back to the pool usable: the next transaction works.
    async with store.transaction() as conn:
        await insert_user(conn, "00000000-0000-4000-8000-000000000003")
    assert await user_ids(store) == ["00000000-0000-4000-8000-000000000003"]


async def test_a_failed_statement_rolls_back_the_whole_transaction(store: Store) -> None:
    with pytest.raises(sa.exc.IntegrityError):
        async with store.transaction() as conn:
            await insert_user(conn, "00000000-0000-4000-8000-000000000001")
            await insert_user(conn, "00000000-0000-4000-8000-000000000001")
    assert await user_ids(store) == []


async def test_on_commit_runs_only_after_the_commit(store: Store) -> None:
    calls: list[str] = []
    async with store.transaction() as conn:
        engine.on_commit(conn, lambda: calls.append("first"))
        await insert_user(conn, "00000000-0000-4000-8000-000000000001")
        engine.on_commit(conn, lambda: calls.append("second"))
        assert calls == []
    assert calls == ["first", "second"]


async def test_on_commit_never_runs_after_a_rollback(store: Store) -> None:
    calls: list[str] = []
    with pytest.raises(Boom):
        async with store.transaction() as conn:
            engine.on_commit(conn, lambda: calls.append("rolled back"))
            raise Boom
    # The next transaction very likely reuses the same pooled connection: the
    # callback of the rolled-back one must not ride along with its commit.
    for _ in range(3):
        async with store.transaction() as conn:
            await insert_user(conn, str(uuid.uuid4()))
        async with store.read() as conn:
            pass
    assert calls == []


async def test_a_read_sees_only_committed_data_while_a_write_is_open(store: Store) -> None:
    async with store.transaction() as writer:
        await insert_user(writer, "00000000-0000-4000-8000-000000000001")
        # A reader is not blocked by the open writer and does not see its rows.
        assert await user_ids(store) == []
    assert await user_ids(store) == ["00000000-0000-4000-8000-000000000001"]


async def test_sqlite_writers_take_the_connection_used_last(sqlite_template: Path, tmp_path: Path) -> None:
    """On SQLite a connection drops its whole page cache when it finds that another one has written
    since its last transaction: this process's writers, one after another, take the pooled
    connection returned last (a writer's, whose cache holds what it wrote), not the one idle
    longest, even after a read held a second connection."""
    path = tmp_path / "gateway.db"
    path.write_bytes(sqlite_template.read_bytes())
    store = Store(f"sqlite:///{path}")
    try:

        async def writer() -> object:
            async with store.transaction() as conn:
                await insert_user(conn, str(uuid.uuid4()))
                return conn.sync_connection.connection.driver_connection

        async with store.read() as reading:  # two connections in the pool from here on
            await reading.execute(sa.select(1))
            await writer()
        assert len({await writer() for _ in range(4)}) == 1
    finally:
        await store.close()


async def test_concurrent_writers_all_commit(store: Store) -> None:
    # On SQLite writers take the lock at BEGIN (IMMEDIATE) and wait their turn
    # on the busy timeout; two read-then-write transactions must not deadlock.
    async def write(n: int) -> None:
        async with store.transaction() as conn:
            await conn.execute(sa.select(sa.func.count()).select_from(tables.users))
            await asyncio.sleep(0)
            await insert_user(conn, f"00000000-0000-4000-8000-{n:012d}")

    await asyncio.gather(*(write(n) for n in range(8)))
    assert len(await user_ids(store)) == 8


async def test_notify_wakes_a_waiter_only_after_commit(store: Store) -> None:
    subscription = store.subscribe("channel")
    other = store.subscribe("other")
    async with store.transaction() as conn:
        engine.notify(conn, "channel")
        assert await subscription.wait(0) is False
    assert await subscription.wait(0) is True
    # A wake-up is consumed by the wait that saw it.
    assert await subscription.wait(0) is False
    assert await other.wait(0) is False


async def test_notify_in_a_rolled_back_transaction_wakes_nobody(store: Store) -> None:
    subscription = store.subscribe("channel")
    with pytest.raises(Boom):
        async with store.transaction() as conn:
            engine.notify(conn, "channel")
            raise Boom
    async with store.transaction():
        pass
    assert await subscription.wait(0) is False


async def test_a_blocked_waiter_is_released_by_a_commit(store: Store) -> None:
    subscription = store.subscribe("channel")
    waiting = asyncio.create_task(subscription.wait(None))
    await asyncio.sleep(0)
    assert not waiting.done()
    async with store.transaction() as conn:
        engine.notify(conn, "channel")
    assert await asyncio.wait_for(waiting, 300) is True


async def test_every_subscriber_is_woken_and_unsubscribe_stops_wake_ups(store: Store) -> None:
    first, second = store.subscribe("channel"), store.subscribe("channel")
    store.unsubscribe("channel", second)
    async with store.transaction() as conn:
        engine.notify(conn, "channel")
    assert await first.wait(0) is True
    assert await second.wait(0) is False


async def test_a_wake_up_before_the_wait_is_not_lost(store: Store) -> None:
    subscription = store.subscribe("channel")
    async with store.transaction() as conn:
        engine.notify(conn, "channel")
    # Woken while nobody was waiting: the next wait returns at once, whatever its timeout.
    assert await subscription.wait(0) is True


async def test_signals_emit_is_part_of_the_callers_transaction(store: Store) -> None:
    subscription = store.subscribe(signals.CHANNEL)
    with clock.use(clock.FrozenClock("2026-11-21T23:03:30.123Z")):
        with pytest.raises(Boom):
            async with store.transaction() as conn:
                await signals.emit(conn, "rolled.back", {"n": 1})
                raise Boom
        assert await subscription.wait(0) is False
        async with store.transaction() as conn:
            signal_id = await signals.emit(conn, "some.kind", {"b": [1, None], "a": "é"})
            assert await subscription.wait(0) is False
    assert await subscription.wait(0) is True
    async with store.read() as conn:
        rows = (await conn.execute(sa.select(tables.signals))).all()
    assert len(rows) == 1
    row = rows[0]
    assert (row.id, row.kind, row.state, row.error) == (signal_id, "some.kind", "pending", None)
    assert row.emitted_at == "2026-11-21T23:03:30.123Z"
    assert list(row.payload) == ["b", "a"] and row.payload == {"b": [1, None], "a": "é"}


def _schema_differences(connection: sa.Connection) -> list:
    return compare_metadata(MigrationContext.configure(connection), tables.metadata)


async def test_migrations_head_equals_the_table_metadata(store: Store) -> None:
    async with store.engine.connect() as conn:
        assert await conn.run_sync(_schema_differences) == []


def test_the_revisions_are_alembics_history() -> None:
    """A database at a revision this version does not list is refused as newer (migrate.Schema)."""
    script = ScriptDirectory.from_config(migrate.alembic_config())
    assert tuple(reversed([revision.revision for revision in script.walk_revisions()])) == migrate.REVISIONS
    assert migrate.REVISIONS[-1] == migrate.HEAD


async def test_the_database_is_at_the_single_head(store: Store) -> None:
    heads = ScriptDirectory.from_config(migrate.alembic_config()).get_heads()
    assert heads == [migrate.HEAD]
    assert await migrate.is_current(store.engine)
    async with store.engine.connect() as conn:
        current = await conn.run_sync(lambda c: MigrationContext.configure(c).get_current_heads())
    assert current == tuple(heads)


async def test_upgrade_on_a_fresh_database_creates_the_schema_and_is_idempotent(empty_database_url: str) -> None:
    store = Store(empty_database_url)
    try:
        async with store.engine.connect() as conn:
            assert (await conn.run_sync(_schema_differences)) != []
        await migrate.upgrade(store.engine)
        await migrate.upgrade(store.engine)
        async with store.engine.connect() as conn:
            assert await conn.run_sync(_schema_differences) == []
    finally:
        await store.close()


def test_migrate_command_on_a_fresh_database_is_idempotent(tmp_path: Path, empty_database_url: str) -> None:
    deployment.write(tmp_path / "d")
    env = {"AGENT_GATEWAY_DATABASE_URL": empty_database_url}
    for said in (f"created the schema (revision {migrate.HEAD})", f"up to date (revision {migrate.HEAD})"):
        result = served.run_cli("migrate", config=tmp_path / "d" / "gateway.toml", env=env)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == said

    async def check() -> list:
        store = Store(empty_database_url)
        try:
            async with store.engine.connect() as conn:
                return await conn.run_sync(_schema_differences)
        finally:
            await store.close()

    assert asyncio.run(check()) == []


_USER_IDS = direct.Query(sa.select(tables.users.c.id).order_by(tables.users.c.id))
_USER_BY_ID = direct.Query(sa.select(tables.users.c.id, tables.users.c.attributes).where(tables.users.c.id == sa.bindparam("id")))


async def test_a_direct_read_sees_each_commit_at_once_and_never_an_open_write(store: Store) -> None:
    first, second = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"
    assert await store.fetch(_USER_IDS) == []
    async with store.transaction() as conn:
        await insert_user(conn, first)
        assert await store.fetch(_USER_IDS) == []
    assert [tuple(row) for row in await store.fetch(_USER_IDS)] == [(first,)]
    # Rows come as the driver gives them: JSON columns are their text.
    assert [tuple(row) for row in await store.fetch(_USER_BY_ID, id=first)] == [(first, "{}")]
    await store.close()  # closing is safe to repeat, and the next read reopens
    await store.close()
    async with store.transaction() as conn:
        await insert_user(conn, second)
    assert [row[0] for row in await store.fetch(_USER_IDS)] == [first, second]


_INSERT_USER = direct.Query(
    tables.users.insert().values(id=sa.bindparam("id"), attributes=sa.bindparam("attributes"), created_at=sa.bindparam("at"))
)


async def insert_user_directly(conn: AsyncConnection, user_id: str) -> list:
    return list(await direct.run(conn, _INSERT_USER, id=user_id, attributes="{}", at=clock.now_iso()))


@pytest.mark.parametrize("first", ["direct", "through SQLAlchemy"])
async def test_a_direct_statement_is_part_of_the_callers_transaction(store: Store, first: str) -> None:
    ids = [f"00000000-0000-4000-8000-00000000000{n}" for n in range(1, 5)]

    async def both(conn: AsyncConnection, one: str, other: str) -> None:
        # Whichever statement comes first begins the transaction; the other joins it.
        if first == "direct":
            await insert_user_directly(conn, one)
            await insert_user(conn, other)
        else:
            await insert_user(conn, one)
            await insert_user_directly(conn, other)

    with pytest.raises(Boom):
        async with store.transaction() as conn:
            await both(conn, ids[0], ids[1])
            assert await store.fetch(_USER_IDS) == []  # not committed yet
            raise Boom
    assert await user_ids(store) == []
    async with store.transaction() as conn:
        await both(conn, ids[2], ids[3])
    assert await user_ids(store) == ids[2:]
    # A direct statement that fails fails its transaction, and the connection serves the next one.
    with pytest.raises(Exception) as failed:
        async with store.transaction() as conn:
            await insert_user(conn, ids[0])
            await insert_user_directly(conn, ids[2])  # a duplicate id
    assert not isinstance(failed.value, Boom)
    async with store.transaction() as conn:
        await insert_user_directly(conn, ids[1])
    assert await user_ids(store) == ids[1:]


async def test_each_statement_alone_commits_by_itself(store: Store) -> None:
    ids = [f"00000000-0000-4000-8000-00000000000{n}" for n in range(1, 4)]
    with pytest.raises(Boom):
        async with store.alone() as conn:
            await insert_user_directly(conn, ids[0])
            assert [row[0] for row in await store.fetch(_USER_IDS)] == ids[:1]  # committed at once
            await insert_user_directly(conn, ids[1])
            raise Boom  # no transaction to roll back
    assert await user_ids(store) == ids[:2]
    # A failed statement fails alone, and the connection serves the next one.
    with pytest.raises(Exception) as failed:
        async with store.alone() as conn:
            await insert_user_directly(conn, ids[0])  # a duplicate id
    assert not isinstance(failed.value, Boom)
    async with store.alone() as conn:
        await insert_user_directly(conn, ids[2])
    async with store.transaction() as conn:  # and a transaction after them works as ever
        await insert_user(conn, "00000000-0000-4000-8000-000000000009")
    assert await user_ids(store) == [*ids, "00000000-0000-4000-8000-000000000009"]


async def test_sqlite_statements_alone_that_wrote_are_reported_as_a_commit_is(tmp_path: Path) -> None:
    committed: list[bool] = []
    connection = await sqlite.connect(str(tmp_path / "alone.db"), committed=lambda: committed.append(True))
    try:
        connection.begin_alone()
        cursor = connection.cursor()
        await cursor.execute("CREATE TABLE t (x INTEGER)")
        connection.end_alone()
        committed.clear()
        connection.begin_alone()
        await cursor.execute("SELECT count(*) FROM t")
        connection.end_alone()
        assert committed == []  # nothing written, no checkpoint asked for
        connection.begin_alone()
        await cursor.execute("INSERT INTO t VALUES (1)")
        connection.end_alone()
        assert committed == [True]  # the WAL's checkpointer is woken, as by a commit
    finally:
        await connection.close()


async def test_a_direct_read_of_an_in_memory_database_uses_its_one_connection() -> None:
    store = Store("sqlite:///:memory:")
    try:
        async with store.engine.begin() as conn:
            await conn.run_sync(tables.metadata.create_all)
        async with store.transaction() as conn:
            await insert_user(conn, "00000000-0000-4000-8000-000000000001")
        assert [row[0] for row in await store.fetch(_USER_IDS)] == ["00000000-0000-4000-8000-000000000001"]
    finally:
        await store.close()


@pytest.fixture
async def sqlite_url(tmp_path: Path) -> str:
    """A migrated SQLite database of the test's own (these tests are about SQLite's write lock)."""
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    await migrate.upgrade_url(url)
    return url


async def test_a_sqlite_writer_waits_for_another_processs_lock_without_holding_up_the_loop(sqlite_url: str) -> None:
    store, other = Store(sqlite_url), Store(sqlite_url)  # as two processes' connections to one file
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    async def write() -> None:
        async with store.transaction() as conn:
            await insert_user(conn, "00000000-0000-4000-8000-000000000002")

    ticker = asyncio.create_task(tick())
    try:
        async with other.transaction() as conn:
            await insert_user(conn, "00000000-0000-4000-8000-000000000001")
            waiting = asyncio.create_task(write())
            await asyncio.sleep(0.3)
            assert not waiting.done()
            assert ticks > 20  # the loop kept running while the writer waited
        await asyncio.wait_for(waiting, 120)
        assert len(await user_ids(store)) == 2
    finally:
        ticker.cancel()
        await store.close()
        await other.close()


async def test_a_sqlite_writer_gives_up_after_the_busy_timeout(sqlite_url: str) -> None:
    store, other = Store(sqlite_url, busy_timeout_s=0.2), Store(sqlite_url)
    try:
        async with other.transaction():
            # BEGIN goes straight to the driver, so its error is the driver's.
            with pytest.raises(sqlite3.OperationalError, match="database is locked"):
                async with store.transaction() as conn:
                    await insert_user(conn, "00000000-0000-4000-8000-000000000002")
        assert await user_ids(store) == []
    finally:
        await store.close()
        await other.close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_write_finding_sqlite_locked_past_the_timeout_is_a_503_and_reads_go_on(
    database_url: str, settings: config.Settings
) -> None:
    gateway = Gateway(dataclasses.replace(settings, database_busy_timeout_ms=200))
    await gateway.start(migrate_first=False)
    other = Store(database_url)  # another process holding the write lock
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.agent_asgi), base_url="http://agent") as agent:
            async with other.transaction():
                refused = await agent.post("/decisions", json={"statement": "s"})
                read = await agent.get("/decisions")
            await check_after(agent, refused, read)
    finally:
        await other.close()
        await gateway.stop()


async def check_after(agent: httpx.AsyncClient, refused: httpx.Response, read: httpx.Response) -> None:
    assert refused.status_code == 503
    assert refused.json()["statusCode"] == 503
    assert read.status_code == 200
    assert (await agent.get("/decisions")).json() == {"decisions": []}
    assert (await agent.post("/decisions", json={"statement": "s"})).status_code == 201


def test_upgrading_a_current_database_does_not_import_alembic(sqlite_url: str) -> None:
    # A serving gateway keeps every module it imports: Alembic only when there is work for it.
    check = (
        "import asyncio, sys\n"
        "from agent_gateway.store import migrate\n"
        f"asyncio.run(migrate.upgrade_url({sqlite_url!r}))\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in ('alembic', 'mako')))\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stderr


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_direct_reads_and_statements_alone_on_postgresql_use_generic_plans(store: Store) -> None:
    # A custom plan per execution costs more as a log grows, and is planned at each bind (see store.direct).
    setting = direct.Query(sa.text("SELECT current_setting('plan_cache_mode')"))
    [(mode,)] = await store.fetch(setting)
    assert mode == "force_generic_plan"
    async with store.alone() as conn:
        [(mode,)] = await direct.run(conn, setting)
    assert mode == "force_generic_plan"
    async with store.transaction() as conn:  # the writing transactions keep PostgreSQL's own choice
        [(mode,)] = await direct.run(conn, setting)
    assert mode == "auto"


async def test_a_failed_statements_error_does_not_carry_its_values(store: Store) -> None:
    secret = "a Statement that must never reach a log"
    insert = tables.decisions.insert().values(seq=1, statement=f'"{secret}"', jws="x.y.z", created_at=clock.now_iso())
    async with store.transaction() as conn:
        await conn.execute(insert)
    with pytest.raises(sa.exc.IntegrityError) as raised:
        async with store.transaction() as conn:
            await conn.execute(insert)  # the same number again
    assert secret not in str(raised.value)


# Users whose attributes fill about two pages each: 600 of them take SQLite's WAL past
# the 1,000 pages at which a commit would checkpoint by default.
_BULK_USERS = 600
_PADDING = "x" * 6000


async def write_bulk(store: Store, count: int = _BULK_USERS) -> list[str]:
    ids = [str(uuid.UUID(int=n, version=4)) for n in range(1, count + 1)]
    for start in range(0, count, 50):
        async with store.transaction() as conn:
            await conn.execute(
                tables.users.insert(),
                [{"id": i, "attributes": {"pad": _PADDING}, "created_at": clock.now_iso()} for i in ids[start : start + 50]],
            )
    return sorted(ids)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_sqlite_commits_leave_wal_checkpoints_to_a_thread(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoints: list[int] = []
    monkeypatch.setattr(wal.Checkpointer, "_checkpoint", lambda self: checkpoints.append(threading.get_ident()))
    database = Path(store.engine.url.database or "")
    before = database.stat().st_size
    await write_bulk(store)
    await asyncio.sleep(0.1)
    # Past SQLite's threshold, yet no commit copied a page into the database file ...
    assert Path(f"{database}-wal").stat().st_size > 1000 * 4096
    assert database.stat().st_size == before
    # ... the checkpointer was asked, and ran on its own thread.
    assert checkpoints and threading.get_ident() not in checkpoints


async def test_writes_past_the_wal_threshold_reach_the_database_file(store: Store) -> None:
    written = await write_bulk(store)
    assert await user_ids(store) == written
    if store.dialect != "sqlite":
        return
    database = Path(store.engine.url.database or "")
    # The checkpointer copies them within its gap; nothing else does (no reader closes).
    async with asyncio.timeout(30):
        while database.stat().st_size < _BULK_USERS * 6000:
            await asyncio.sleep(0.05)
    await store.close()
    with contextlib.closing(sqlite3.connect(database)) as conn:
        assert conn.execute("SELECT count(*) FROM users").fetchone() == (_BULK_USERS,)


_WRITE_THEN_DIE = """
import asyncio, os, signal, sys
from tests.store.test_engine import write_bulk
from agent_gateway.store.engine import Store

async def main():
    store = Store(sys.argv[1])
    await write_bulk(store)
    print("committed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # mid-checkpoint, or before one: no clean close

asyncio.run(main())
"""


def test_a_killed_process_loses_no_committed_write(database_url: str) -> None:
    result = subprocess.run([sys.executable, "-c", _WRITE_THEN_DIE, database_url], capture_output=True, text=True, timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert result.stdout == "committed\n"

    async def count() -> int:
        store = Store(database_url)
        try:
            return len(await user_ids(store))
        finally:
            await store.close()

    assert asyncio.run(count()) == _BULK_USERS


async def test_rows_carried_by_a_rolled_back_transaction_are_never_written(store: Store) -> None:
    """On PostgreSQL a transaction's last statement writes what it carries (engine.carry); a
    pooled connection's info outlives the transaction, so a rollback's rows must not ride on
    the next transaction's NOTIFY (on SQLite they are written at once, and rolled back)."""
    from agent_gateway.store.queries import webhooks

    now = clock.now_iso()
    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            row = (str(uuid.uuid4()), "http://127.0.0.1:9/hooks", "message.inbound", "{}", None, now, now, now)
            await webhooks.insert(conn, [row], channel="webhooks")
            raise RuntimeError("roll back")
    for _ in range(3 * store.engine.pool.size()):  # every pooled connection, more than once
        async with store.transaction() as conn:
            engine.notify(conn, "signals")
    async with store.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(tables.webhook_deliveries))).scalar() == 0


_BACKEND_PID = direct.Query(sa.text("SELECT pg_backend_pid()"))


async def test_a_serial_writer_writes_alone_on_a_connection_of_its_own(store: Store) -> None:
    """``Store.alone_writer``: statements that each commit by themselves, as ``Store.alone``'s; on
    PostgreSQL on one connection kept for the writer (once opened beside its first use, which
    takes one of the pool's), not checked out of the reads' pool each time."""
    writer = store.alone_writer()
    ids = [f"00000000-0000-4000-8000-00000000000{n}" for n in range(1, 4)]
    async with writer() as conn:
        await insert_user_directly(conn, ids[0])
        assert [row[0] for row in await store.fetch(_USER_IDS)] == ids[:1]  # committed at once
    if store.dialect == "postgresql":
        await writer.opened()  # type: ignore[attr-defined]
    with pytest.raises(Exception) as failed:  # refused by the database: the connection serves the next use
        async with writer() as conn:
            [(refused_on,)] = await direct.run(conn, _BACKEND_PID) if store.dialect == "postgresql" else [(None,)]
            await insert_user_directly(conn, ids[0])
    assert "UNIQUE" in str(failed.value).upper() or "unique" in type(failed.value).__name__.lower()
    pids = set()
    async with writer() as conn:
        await insert_user_directly(conn, ids[1])
        if store.dialect == "postgresql":
            [(pid,)] = await direct.run(conn, _BACKEND_PID)
            pids.add(pid)
    assert await user_ids(store) == ids[:2]
    if store.dialect != "postgresql":
        return
    for _ in range(3):
        async with writer() as conn:
            [(pid,)] = await direct.run(conn, _BACKEND_PID)
            pids.add(pid)
    [(pooled,)] = await store.fetch(_BACKEND_PID)
    assert pids == {refused_on} and pooled not in pids


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_serial_writer_gets_a_fresh_connection_once_its_own_is_lost_or_cut(
    store: Store, database_url: str
) -> None:
    writer = store.alone_writer()

    async def pid() -> int:
        async with writer() as conn:
            [(number,)] = await direct.run(conn, _BACKEND_PID)
        return int(number)

    async def own_pid() -> int:
        """The writer's own connection's, once it is open (a use meanwhile takes the pool's)."""
        await pid()
        await writer.opened()  # type: ignore[attr-defined]
        return await pid()

    async def sleep_alone() -> None:
        async with writer() as conn:
            await direct.run(conn, direct.Query(sa.text("SELECT pg_sleep(2)")))

    async def sessions(pid: int, like: str = "%") -> int:
        connection = await asyncpg.connect(database_url)
        try:
            return int(await connection.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND query LIKE $2", pid, like
            ))
        finally:
            await connection.close()

    async def until(condition: Any) -> None:
        for _ in range(30_000):
            if await condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("condition not reached")

    first = await own_pid()
    [(pooled,)] = await store.fetch(_BACKEND_PID)
    # Ended by the server (an administrator, a restart): a use that meets the loss fails as a
    # statement would, and the writer goes on, on a new connection of its own.
    [(ended,)] = await store.fetch(direct.Query(sa.text("SELECT pg_terminate_backend(:pid)")), pid=first)
    assert ended
    await until(lambda: _not(sessions(first)))
    with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        await pid()
    second = await own_pid()
    assert second not in (first, pooled)
    # Cancelled mid-statement: that connection is not used again (it may still be busy).
    sleeping = asyncio.create_task(sleep_alone())
    await until(lambda: sessions(second, "%pg_sleep%"))
    sleeping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeping
    third = await own_pid()
    assert third not in (first, second, pooled)
    # Closed with the Store.
    await store.close()
    await until(lambda: _not(sessions(third)))


async def _not(count: Any) -> bool:
    return not await count
