"""The database as coordinator: wake-ups across processes, one leader, clear 503s."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

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


class Relay:
    """A TCP relay between a Store's connections and PostgreSQL, for the faults a server on
    this host never makes by itself.

    ``hold_ends``: a session the server ends is not ended on the client's side (its last
    bytes are passed on, its end is not), as when the ending backend is slow to exit.
    :meth:`freeze`: the sessions open now stop passing anything either way, as behind a
    network that drops everything; sessions opened afterwards pass as usual.
    ``late_s``: while set, what the server sends is passed on that much later, as from a database
    or a host busy for a moment; :attr:`answered` counts what it sent.
    """

    def __init__(self, database_url: str, *, hold_ends: bool = False) -> None:
        self.target = urlsplit(engine.libpq_dsn(database_url))
        self.hold_ends = hold_ends
        self.late_s = 0.0
        self.answered = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        """Start relaying; the URL of the database through this relay."""
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        user, at, _ = self.target.netloc.rpartition("@")
        return urlunsplit(self.target._replace(netloc=f"{user}{at}127.0.0.1:{port}"))

    def freeze(self) -> None:
        for pipe in self._pipes:
            pipe.cancel()  # the sockets stay open (their writers are kept), and silent

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        self.freeze()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        for writer in self._writers:
            writer.close()
        # A transport closes its socket on a later turn of the loop: waited for here, so that none
        # is left to the garbage collector once this test's loop is gone (a ResourceWarning
        # failing whichever test runs next in this worker).
        await asyncio.gather(*(writer.wait_closed() for writer in self._writers), return_exceptions=True)
        await self._server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(self.target.hostname, self.target.port)
        self._writers += [writer, upstream_writer]
        for source, target, answers in ((reader, upstream_writer, False), (upstream_reader, writer, True)):
            pipe = asyncio.create_task(self._pipe(source, target, answers))
            self._pipes.add(pipe)
            pipe.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: asyncio.StreamReader, target: asyncio.StreamWriter, answers: bool) -> None:
        """``answers``: the server's side, which ``late_s`` and ``hold_ends`` apply to."""
        holds = answers and self.hold_ends
        with contextlib.suppress(OSError):
            while data := await source.read(65536):
                if answers and self.late_s:
                    await asyncio.sleep(self.late_s)
                target.write(data)
                self.answered += answers
                await target.drain()
            if not holds:
                target.close()


async def _lock_attempts(database_url: str) -> int:
    """Sessions of this database whose last statement tried for an advisory lock they do not hold (standbys)."""
    conn = await asyncpg.connect(engine.libpq_dsn(database_url))
    try:
        return await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'SELECT pg_try_advisory_lock%' AND pid <> pg_backend_pid() "
            "AND pid NOT IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)"
        )
    finally:
        await conn.close()


@dataclasses.dataclass
class Leader:
    """A process leading "test-role": its work leads until cancelled and counts its terms;
    ``events`` tells each term's start, the lock found lost (``on_lost``) and the work's cancellation."""

    task: asyncio.Task[None] | None = None
    terms: int = 0
    events: list[str] = dataclasses.field(default_factory=list)


@contextlib.asynccontextmanager
async def leader_through(relay: Relay, *, check_s: float) -> AsyncIterator[Leader]:
    """A :class:`Leader` whose connections go through ``relay``; stopped, and the relay closed, after."""
    store = Store(await relay.start())
    leader = Leader()

    async def work() -> None:
        leader.terms += 1
        leader.events.append("leading")
        try:
            await asyncio.Event().wait()
        finally:
            leader.events.append("cancelled")

    leader.task = asyncio.create_task(
        leadership.lead(
            store, "test-role", work, retry_s=0.1, check_s=check_s, on_lost=lambda: leader.events.append("lost")
        )
    )
    try:
        yield leader
    finally:
        leader.task.cancel()
        await asyncio.gather(leader.task, return_exceptions=True)
        await store.close()
        await relay.close()


@postgresql_only
async def test_a_lock_session_ended_between_two_checks_is_lost_leadership_and_it_leads_again(
    database_url: str,
) -> None:
    """The server's FATAL reaches the leader before the end of its socket (a backend slow to
    exit, under load): asyncpg's next statement then raises InternalClientError, which must
    send the process back to standing by like any lost lock, not end its leading for good."""
    async with leader_through(Relay(database_url, hold_ends=True), check_s=0.1) as leader:
        assert leader.task is not None
        await _until(lambda: leader.terms == 1)
        await terminate_lock_sessions(database_url)
        await _until(lambda: leader.terms > 1 or leader.task.done())
        assert not leader.task.done(), leader.task.exception()


@postgresql_only
async def test_a_leader_that_finds_its_lock_lost_calls_on_lost_before_its_work_is_cancelled(database_url: str) -> None:
    """``on_lost`` (the Signal Worker's: kill the agent program at once) comes before the work's
    cancellation, whose graceful stops could outlast the new leader's wait; then it leads again."""
    async with leader_through(Relay(database_url), check_s=0.1) as leader:
        await _until(lambda: leader.terms == 1)
        await terminate_lock_sessions(database_url)
        await _until(lambda: leader.terms == 2)
        assert leader.events == ["leading", "lost", "cancelled", "leading"]


@postgresql_only
async def test_a_lock_connection_slow_to_answer_for_a_moment_keeps_its_leader(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Checks answered two checks' time late (a database or a host busy for a moment) are not a
    lost connection: the leader's work goes on, never restarted. Before, a check had one check's
    time to answer, and such a moment cancelled the work (failing the Signal of its Run)."""
    check_s = 0.5
    relay = Relay(database_url)
    async with leader_through(relay, check_s=check_s) as leader:
        assert leader.task is not None
        await _until(lambda: leader.terms == 1)
        relay.late_s = 2 * check_s
        answered = relay.answered
        await _until(lambda: relay.answered >= answered + 3)  # three checks answered late
        relay.late_s = 0.0
        assert leader.terms == 1 and not leader.task.done()
        assert "lost the lock connection" not in caplog.text


@postgresql_only
async def test_a_standby_whose_lock_attempt_hangs_starts_over_and_leads(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leadership, "DATABASE_TIMEOUT_S", 0.5)
    holder = await asyncpg.connect(engine.libpq_dsn(database_url))  # another process's leader, which never checks
    await holder.execute("SELECT pg_advisory_lock($1)", leadership.lock_key("test-role"))
    relay = Relay(database_url)
    store = Store(await relay.start())
    leading = asyncio.Event()

    async def work() -> None:
        leading.set()
        await asyncio.Event().wait()

    standby = asyncio.create_task(leadership.lead(store, "test-role", work, retry_s=0.1, check_s=0.1))
    try:
        while not await _lock_attempts(database_url):  # the standby is connected and asking
            await asyncio.sleep(0.02)
        relay.freeze()  # its next attempt is never answered
        await holder.close()  # the lock is free: the standby takes it once it starts over
        await _until(leading.is_set)
    finally:
        standby.cancel()
        await asyncio.gather(standby, return_exceptions=True)
        await store.close()
        await relay.close()
        holder.terminate()


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
