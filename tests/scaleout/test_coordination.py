"""The database as coordinator: wake-ups across processes, one leader, clear 503s."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest
from sqlalchemy import exc as sa_exc

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.signatures import keys
from agent_gateway.store import engine, leadership
from agent_gateway.store.unavailable import database_unavailable
from agent_gateway.store.engine import Store

from tests.conftest import terminate_lock_sessions


async def _until(predicate, timeout: float = 120.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_notify_wakes_only_after_commit_in_this_process(store: Store) -> None:
    subscription = store.subscribe("signals")
    async with store.transaction() as conn:
        engine.notify(conn, "signals")
        assert not await subscription.wait(0.05), "woken before commit"
    assert await subscription.wait(1)

    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            engine.notify(conn, "signals")
            raise RuntimeError("roll back")
    assert not await subscription.wait(0.1), "a rolled-back transaction woke a waiter"


async def test_the_listening_process_is_not_woken_again_by_its_own_commit(database_url: str) -> None:
    """Its subscribers are woken at commit; its own NOTIFY (or datagram) must not wake them again."""
    store = Store(database_url)
    published: list[str] = []
    publish = store.notifier.publish
    store.notifier.publish = lambda channel: (published.append(channel), publish(channel))  # type: ignore[method-assign]
    try:
        subscription = store.subscribe("signals")
        store.listen()
        if store.dialect == "postgresql":
            assert await subscription.wait(120), "the listener wakes every channel once when it connects"
        published.clear()
        async with store.transaction() as conn:
            engine.notify(conn, "signals")
        assert await subscription.wait(5)
        await asyncio.sleep(0.5)  # a notification of its own would have come back by now
        assert published == ["signals"]
    finally:
        await store.close()


# Leadership is PostgreSQL's; a SQLite deployment has one process running the loops.
postgresql_only = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


async def test_notify_crosses_stores(database_url: str) -> None:
    """Two Stores on one database stand for two processes (NOTIFY, or SQLite's datagram)."""
    listening, writing = Store(database_url), Store(database_url)
    try:
        subscription = listening.subscribe("schedules")
        listening.listen()
        await subscription.wait(2)  # the listener wakes everything once when it connects
        other = listening.subscribe("signals")
        async with writing.transaction() as conn:
            engine.notify(conn, "schedules")
        assert await subscription.wait(5), "NOTIFY from another Store did not arrive"
        assert not await other.wait(0.2), "a channel nobody wrote to was woken"
    finally:
        await listening.close()
        await writing.close()


@postgresql_only
async def test_one_leader_at_a_time_and_a_standby_takes_over(database_url: str) -> None:
    stores = [Store(database_url), Store(database_url)]
    leading: list[int] = []
    overlaps: list[tuple[int, ...]] = []
    released = [asyncio.Event(), asyncio.Event()]

    def work(index: int):
        async def run() -> None:
            leading.append(index)
            if len(leading) > 1:
                overlaps.append(tuple(leading))
            try:
                await released[index].wait()
            finally:
                leading.remove(index)

        return run

    tasks = [
        asyncio.create_task(leadership.lead(stores[i], "test-role", work(i), retry_s=0.1, check_s=0.1))
        for i in range(2)
    ]
    try:
        await _until(lambda: len(leading) == 1)
        first = leading[0]
        await asyncio.sleep(0.5)
        assert leading == [first], "the standby ran while the leader held the lock"
        await terminate_lock_sessions(database_url)
        await _until(lambda: leading == [1 - first])
        assert not overlaps
        released[1 - first].set()
        await asyncio.wait_for(tasks[1 - first], 120)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for store in stores:
            await store.close()


async def test_unreachable_database_answers_503_with_the_error_body(unused_tcp_port: int) -> None:
    unreachable = config.Settings(
        token_ttl_ms=60_000,
        database_url=f"postgresql://postgres@127.0.0.1:{unused_tcp_port}/nothing",
        signing_key_pem=keys.generate_pem("ed25519").decode(),  # a gateway needs its signing key
    )
    gateway = Gateway(unreachable)  # not started: no migration possible
    transport = httpx.ASGITransport(app=gateway.agent_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
        response = await client.get("/users")
    await gateway.stop()
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/json"
    assert set(response.json()) == {"statusCode", "error", "message"}
    assert response.json()["error"] == "Service Unavailable"


def test_every_way_a_postgresql_restart_shows_itself_is_unavailable_not_a_bug() -> None:
    # What the restart test in test_processes.py met: SQLAlchemy's asyncpg adapter wraps a
    # refused connect in a plain DBAPIError whose cause is the driver's error, and the
    # Token lookup's own pool raises the driver's errors unwrapped.
    def wrapped(cause: BaseException) -> sa_exc.DBAPIError:
        adapted = Exception(str(cause))
        adapted.__cause__ = cause
        return sa_exc.DBAPIError("SELECT 1", None, adapted)

    unavailable = [
        asyncpg.exceptions.CannotConnectNowError("the database system is shutting down"),
        asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.InternalClientError("cannot switch to state 12; another operation (2) is in progress"),
        ConnectionRefusedError(),
    ]
    for exc in unavailable:
        assert database_unavailable(exc), exc
        assert database_unavailable(wrapped(exc)), exc
    for bug in (asyncpg.exceptions.UndefinedTableError("no such table"), ValueError("a bug")):
        assert not database_unavailable(bug)
        assert not database_unavailable(wrapped(bug))
