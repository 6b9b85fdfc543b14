"""The Message-log service and its queries, on both backends."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import sqlalchemy as sa

from agent_gateway import clock, jsontext
from agent_gateway.messages import service
from agent_gateway.signals import service as signals
from agent_gateway.store import engine as engine_module
from agent_gateway.store import notifications
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import messages as queries
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.store.window import Window
from agent_gateway.users import service as users

from tests.messages.records import stored_messages, stored_signals, waiting_on_a_lock


async def admit(store: Store) -> str:
    async with store.transaction() as conn:
        return (await users.admit(conn)).id


async def test_both_directions_share_one_sequence(store: Store) -> None:
    user_id = await admit(store)
    async with store.transaction() as conn:
        first = await service.receive(conn, user_id, "hello")
        second = await service.send(conn, user_id, "hi there")
        third = await service.receive(conn, user_id, "thanks")
    assert [(m.seq, m.direction, m.text) for m in (first, second, third)] == [
        (1, "inbound", "hello"),
        (2, "outbound", "hi there"),
        (3, "inbound", "thanks"),
    ]
    log = await service.read(store, user_id, Window())
    assert log == [first, second, third]


async def test_message_fields(store: Store) -> None:
    user_id = await admit(store)
    with clock.use(clock.FrozenClock("2026-11-21T23:03:30.123Z")):
        async with store.transaction() as conn:
            message = await service.send(conn, user_id, "x")
    assert message.to_json() == {
        "id": message.id,
        "userId": user_id,
        "direction": "outbound",
        "seq": 1,
        "text": "x",
        "createdAt": "2026-11-21T23:03:30.123Z",
    }
    assert message.id and isinstance(message.id, str)


async def test_receive_emits_one_signal_carrying_the_message(store: Store) -> None:
    user_id = await admit(store)
    async with store.transaction() as conn:
        message = await service.receive(conn, user_id, "wake up")
    [signal] = await stored_signals(store)
    assert signal["kind"] == "message.received"
    assert signal["state"] == "pending"
    assert signal["origin"] == "message"  # the Run ledger tells it from the operator's Signals
    assert signal["payload"] == message.to_json()
    assert list(signal["payload"]) == ["id", "userId", "direction", "seq", "text", "createdAt"]


async def test_messages_and_signals_get_ids_in_time_order_users_random_ones(store: Store) -> None:
    user_id = await admit(store)
    made = []
    for text in ("one", "two"):
        async with store.transaction() as conn:
            made.append(await service.receive(conn, user_id, text))
        started = time.monotonic_ns()
        while time.monotonic_ns() - started < 2_000_000:  # into a later millisecond
            pass
    signals_ = await stored_signals(store)
    for ids_ in ([message.id for message in made], [signal["id"] for signal in signals_]):
        assert [uuid.UUID(id_).version for id_ in ids_] == [7, 7]
        assert sorted(ids_) == ids_
    # A User's id is their only handle: it says nothing of when it was issued.
    assert uuid.UUID(user_id).version == 4


async def test_send_emits_no_signal(store: Store) -> None:
    user_id = await admit(store)
    async with store.transaction() as conn:
        await service.send(conn, user_id, "an answer")
    assert await stored_signals(store) == []


async def test_rolled_back_receive_leaves_neither_message_nor_signal(store: Store) -> None:
    user_id = await admit(store)
    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            await service.receive(conn, user_id, "never mind")
            raise RuntimeError("the caller's transaction fails later")
    assert await stored_messages(store) == []
    assert await stored_signals(store) == []


async def test_another_users_activity_never_moves_a_users_seq(store: Store) -> None:
    alice, bob = await admit(store), await admit(store)
    async with store.transaction() as conn:
        for n in range(3):
            await service.receive(conn, alice, f"a{n}")
            await service.send(conn, bob, f"b{n}")
            await service.send(conn, bob, f"b{n}'")
    alice_log = await service.read(store, alice, Window())
    bob_log = await service.read(store, bob, Window())
    assert [m.seq for m in alice_log] == [1, 2, 3]
    assert [m.text for m in alice_log] == ["a0", "a1", "a2"]
    assert [m.seq for m in bob_log] == [1, 2, 3, 4, 5, 6]
    assert {m.user_id for m in bob_log} == {bob}


@pytest.mark.parametrize("write", [service.receive, service.send])
async def test_unknown_user_is_refused_and_nothing_stored(store: Store, write) -> None:
    with pytest.raises(users.UserNotFound):
        async with store.transaction() as conn:
            await write(conn, str(uuid.uuid4()), "anyone there?")
    assert await stored_messages(store) == []
    assert await stored_signals(store) == []


@pytest.mark.parametrize("text", ["", "a\x00b", "\x00", None, 7, ["a"]])
@pytest.mark.parametrize("write", [service.receive, service.send])
async def test_invalid_text_is_refused_and_nothing_stored(store: Store, write, text) -> None:
    user_id = await admit(store)
    with pytest.raises(service.InvalidText):
        async with store.transaction() as conn:
            await write(conn, user_id, text)
    assert await stored_messages(store) == []


async def test_reading_the_log_of_nobody_is_empty(store: Store) -> None:
    assert await service.read(store, str(uuid.uuid4()), Window()) == []


async def test_cursor_windows(store: Store) -> None:
    user_id = await admit(store)
    async with store.transaction() as conn:
        for n in range(1, 8):
            await service.send(conn, user_id, str(n))

    async def seqs(window: Window) -> list[int]:
        return [m.seq for m in await service.read(store, user_id, window)]

    assert await seqs(Window(limit=3)) == [5, 6, 7]
    assert await seqs(Window(before=5, limit=3)) == [2, 3, 4]
    assert await seqs(Window(before=2, limit=3)) == [1]
    assert await seqs(Window(after=0, limit=3)) == [1, 2, 3]
    assert await seqs(Window(after=3, limit=3)) == [4, 5, 6]
    assert await seqs(Window(after=7)) == []
    assert await seqs(Window(before=1)) == []


# PostgreSQL only: SQLite serialises writers at BEGIN IMMEDIATE, so two cannot interleave.
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_lost_race_raises_and_the_transaction_stores_nothing(store: Store) -> None:
    """Two writers that skip the User lock compute the same seq; the loser gets LostRace.

    Run for real on PostgreSQL (two open transactions). On SQLite a second
    writer cannot even begin while the first holds BEGIN IMMEDIATE, so the
    race cannot happen there; the HTTP tests provoke the collision on both.
    """
    user_id = await admit(store)
    fields = dict(user_id=user_id, direction="outbound", text="x", created_at=clock.now_iso())
    async with store.transaction() as winner:
        await queries.append(winner, id=str(uuid.uuid4()), **fields)

        async def lose() -> None:
            async with store.transaction() as loser:
                # Computes seq 1 (the winner's row is uncommitted), then waits on the key.
                await queries.append(loser, id=str(uuid.uuid4()), **fields)

        losing = asyncio.create_task(lose())
        await waiting_on_a_lock(store)
    with pytest.raises(queries.LostRace):
        await losing
    assert [row["seq"] for row in await stored_messages(store)] == [1]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_statement_alone_writes_a_batch_of_one_in_its_own_form_and_numbers_it_as_a_batch(
    store: Store, database_url: str
) -> None:
    """On PostgreSQL a batch of one row is written by the INSERT's one-row form, more rows by the
    batch's (the same parameters): each numbers the User's log one past its largest seq, leaves
    a User nobody holds unwritten, and wakes the User's streams in another process."""
    user_id, nobody = await admit(store), str(uuid.uuid4())

    def rows(*texts: str, user: str = user_id) -> list[tuple[str, str, str, str, str]]:
        return [(str(uuid.uuid4()), user, "outbound", text, clock.now_iso()) for text in texts]

    assert queries._APPEND_ALONE.of(rows("a")) is queries._APPEND_ALONE.one
    assert queries._APPEND_ALONE.of(rows("a", "b")) is queries._APPEND_ALONE.many
    assert "unnest" not in queries._APPEND_ALONE.one.bind(store.engine.dialect, {})[0].split("woken AS")[0]
    other = Store(database_url)  # another process's, listening as the one that serves streams does
    probe, stream = other.subscribe("probe"), other.subscribe(service.channel(user_id))
    other.listen()
    try:
        async with asyncio.timeout(WAKE_CEILING_S):  # connected: every channel woken once
            await probe.wait(None)
            await stream.wait(None)
        wake = [notifications.pg_payload(store.origin, service.channel(user_id))]
        async with store.alone() as conn:
            [one] = await queries.append_alone(conn, rows("one"), wake)
            async with asyncio.timeout(WAKE_CEILING_S):
                assert await stream.wait(None) is True
            two, three = await queries.append_alone(conn, rows("two", "three"), wake)
            [four] = await queries.append_alone(conn, rows("four"), wake)
            assert await queries.append_alone(conn, rows("lost", user=nobody), []) == [None]
    finally:
        await other.close()
    written = [(1, "one"), (2, "two"), (3, "three"), (4, "four")]
    assert [(m.seq, m.text) for m in (one, two, three, four)] == written  # type: ignore[union-attr]
    assert [(row["seq"], row["text"]) for row in await stored_messages(store)] == written


async def test_append_many_writes_drafts_in_order_answering_refusals_in_their_place(store: Store) -> None:
    alice, bob = await admit(store), await admit(store)
    async with store.transaction() as conn:
        await service.send(conn, alice, "a0")
    nobody = str(uuid.uuid4())
    drafts = [
        service.Draft(bob, "inbound", "b1"),
        service.Draft(alice, "outbound", "a1"),
        service.Draft(nobody, "inbound", "lost"),
        service.Draft(alice, "inbound", ""),
        service.Draft(alice, "inbound", "a2"),
        service.Draft(bob, "inbound", "b\x00"),
        service.Draft(bob, "outbound", "b2"),
    ]
    async with store.transaction() as conn:
        recorded = await service.append_many(conn, drafts)
    assert isinstance(recorded[2], service.UserNotFound)
    assert isinstance(recorded[3], service.InvalidText) and isinstance(recorded[5], service.InvalidText)
    written = [recorded[i] for i in (0, 1, 4, 6)]
    assert [(m.user_id, m.seq, m.direction, m.text) for m in written] == [  # type: ignore[union-attr]
        (bob, 1, "inbound", "b1"),
        (alice, 2, "outbound", "a1"),
        (alice, 3, "inbound", "a2"),
        (bob, 2, "outbound", "b2"),
    ]
    # One Signal per inbound Message, in the order of the Messages.
    assert [signal["payload"] for signal in await stored_signals(store)] == [written[0].to_json(), written[2].to_json()]  # type: ignore[union-attr]
    assert len(await stored_messages(store)) == 5


async def test_a_writer_numbers_concurrent_messages_of_many_users(store: Store) -> None:
    writer = service.Writer(store)
    alice, bob = await admit(store), await admit(store)
    sends = [writer.receive(alice if i % 3 else bob, f"m{i}") for i in range(30)]
    messages = await asyncio.gather(*sends)
    for user_id in (alice, bob):
        mine = [m for m in messages if m.user_id == user_id]
        assert [m.seq for m in mine] == list(range(1, len(mine) + 1))
        assert await service.read(store, user_id, Window(after=0, limit=200)) == mine
    assert len(await stored_signals(store)) == 30
    with pytest.raises(service.UserNotFound):
        await writer.send(str(uuid.uuid4()), "to nobody")


async def test_writers_of_many_users_logs_at_once_in_two_processes_never_deadlock_nor_skip_a_number(
    store: Store, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL each process's batch of several Users' Messages is one statement written alone
    that locks its Users in the order of their ids, as a transaction's lock_logs does: writers of
    overlapping sets of logs, each way, in two processes (and a transaction beside them) wait for
    one another but never each on the other (a deadlock would fail a statement: every one is
    watched). On SQLite each batch is a transaction, the database's one writer at a time."""
    other = Store(database_url)  # another process's
    users_ = [await admit(store) for _ in range(6)]
    failures: list[BaseException] = []
    batches: list[int] = []
    append_alone = queries.append_alone

    async def watched(conn, rows, payloads, received=None):  # type: ignore[no-untyped-def]
        batches.append(len({row[1] for row in rows}))
        try:
            return await append_alone(conn, rows, payloads, received)
        except queries.LostRace:  # run again by the writer: no failure
            raise
        except BaseException as exc:
            failures.append(exc)
            raise

    monkeypatch.setattr(queries, "append_alone", watched)
    try:
        writers = [service.Writer(store), service.Writer(other)]
        sends = []
        for round_ in range(12):
            for index, user_id in enumerate(users_ if round_ % 2 else users_[::-1]):
                writer = writers[(round_ + index) % 2]
                sends.append(writer.receive(user_id, f"in {round_}") if index % 3 else writer.send(user_id, f"out {round_}"))

        async def in_a_transaction() -> None:
            async with store.transaction() as conn:
                await service.append_many(conn, [service.Draft(user_id, "inbound", "held") for user_id in users_[::-1]])

        outcomes = await asyncio.gather(*sends, in_a_transaction(), return_exceptions=True)
    finally:
        await other.close()
    assert [outcome for outcome in outcomes if isinstance(outcome, BaseException)] == []
    assert failures == []
    if store.dialect == "postgresql":
        assert max(batches) > 1  # several Users' Messages went in one statement
    for user_id in users_:
        log = await service.read(store, user_id, Window(after=0, limit=200))
        assert [message.seq for message in log] == list(range(1, 13 + 1))


# A ceiling for a wake-up from another process, never a duration.
WAKE_CEILING_S = 120.0


async def test_a_written_message_wakes_its_users_streams_in_another_process_and_a_rolled_back_one_never(
    store: Store, database_url: str
) -> None:
    other = Store(database_url)  # another process's, listening as the one that serves streams does
    probe = other.subscribe("probe")
    other.listen()
    try:
        if other.dialect == "postgresql":
            # Connected, the listener wakes every channel once: subscribe only after that one.
            async with asyncio.timeout(WAKE_CEILING_S):
                await probe.wait(None)
        rolled_back, written = await admit(store), await admit(store)
        streams = {user: other.subscribe(service.channel(user)) for user in (rolled_back, written)}
        with pytest.raises(Boom):
            async with store.transaction() as conn:
                await service.send(conn, rolled_back, "never")
                raise Boom
        async with store.transaction() as conn:
            await service.send(conn, written, "hello")
            if store.dialect == "postgresql":
                # The wake-up rides on the Message's INSERT: the commit sends no NOTIFY of its own.
                assert not conn.info.get(engine_module._CHANNELS)
        async with asyncio.timeout(WAKE_CEILING_S):
            assert await streams[written].wait(None) is True
        # Wake-ups arrive in commit order: the rolled-back one would have come first.
        assert await streams[rolled_back].wait(0) is False
    finally:
        await other.close()


class Boom(Exception):
    pass


async def the_waiting_statement(store: Store) -> str:
    """The one statement waiting on a lock in ``store``'s database (PostgreSQL), once one waits."""
    await waiting_on_a_lock(store)
    async with store.read() as conn:
        [waiting] = (await conn.execute(sa.text(
            "SELECT query FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ))).scalars().all()
    return waiting


async def test_an_answer_written_beside_a_writer_holding_the_users_log_takes_the_next_number(store: Store) -> None:
    """On PostgreSQL the agent's answer is one statement committed alone, which takes the User's
    lock: it waits for the holder, finds its number taken once the holder commits (its snapshot
    predates that), and is run again (no 503). On SQLite it waits for the write lock, as every
    writer does."""
    writer = service.Writer(store)
    user_id = await admit(store)
    async with store.transaction() as holder:
        first = await service.receive(holder, user_id, "first")
        answering = asyncio.create_task(writer.send(user_id, "answer"))
        if store.dialect == "postgresql":
            # The answer's INSERT itself waits, on the User's lock it takes: no statement before it.
            waiting = await the_waiting_statement(store)
            assert "FOR UPDATE" in waiting and "INSERT INTO messages" in waiting
    answer = await answering
    assert (first.seq, answer.seq) == (1, 2)
    assert [(row["seq"], row["text"]) for row in await stored_messages(store)] == [(1, "first"), (2, "answer")]


async def test_an_inbound_message_written_beside_a_holder_writes_its_signal_as_a_transaction_does(
    store: Store, database_url: str
) -> None:
    """On PostgreSQL a User's inbound Message (where no ``message.inbound`` webhook is served) is
    one statement committed alone that also writes its Signal: the Signal's payload is the text a
    transaction writes, byte for byte, with the number the statement gave, and the Signal Worker
    of another process is woken. On SQLite the transaction writes them, as for every writer."""
    other = Store(database_url)  # another process's, where the Signal Worker may lead
    probe, woken = other.subscribe("probe"), other.subscribe(signals.CHANNEL)
    other.listen()
    writer = service.Writer(store)
    user_id = await admit(store)
    try:
        if other.dialect == "postgresql":
            async with asyncio.timeout(WAKE_CEILING_S):  # connected: every channel woken once
                await probe.wait(None)
                await woken.wait(None)
        async with store.transaction() as holder:
            first = await service.receive(holder, user_id, "first")
            receiving = asyncio.create_task(writer.receive(user_id, 'second "quoted" \\ é\n\u2028'))
            if store.dialect == "postgresql":
                waiting = await the_waiting_statement(store)
                assert all(part in waiting for part in ("FOR UPDATE", "INSERT INTO messages", "INSERT INTO signals"))
        second = await receiving
        assert (first.seq, second.seq) == (1, 2)
        async with asyncio.timeout(WAKE_CEILING_S):
            assert await woken.wait(None) is True
        async with store.read() as conn:
            stored = (await conn.execute(sa.text("SELECT kind, payload, state, origin FROM signals ORDER BY position"))).all()
        assert [tuple(row) for row in stored] == [
            ("message.received", jsontext.dumps(message.to_json()).decode(), "pending", "message")
            for message in (first, second)
        ]
        emitted = (await stored_signals(store))[1]["emitted_at"]
        found = await signal_queries.carrying(store, kind="message.received", since=emitted, until=emitted, payload_id=second.id)
        assert found is not None and found.payload == second.to_json()
    finally:
        await other.close()
