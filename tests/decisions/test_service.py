"""The Decision log's programmatic API: numbering, transactions, concurrency."""

from __future__ import annotations

import asyncio
import functools

import asyncpg
import orjson
import pytest
import sqlalchemy as sa

from agent_gateway import errors, jsontext
from agent_gateway.decisions import service
from agent_gateway.signatures import keys
from agent_gateway.signatures.identity import AlgorithmMismatch, SigningIdentity
from agent_gateway.store import direct
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import decisions as decisions_queries
from agent_gateway.store.window import Window
from agent_gateway.webhooks import outbox
from tests.signatures.helpers import segments

identity = SigningIdentity(keys.generate_pem("ed25519"))


async def publish(store: Store, statement: str) -> service.Decision:
    async with store.transaction() as conn:
        return await service.publish(conn, identity, statement)


async def test_a_rolled_back_publish_leaves_no_record_and_the_log_goes_on(store: Store) -> None:
    first = await publish(store, "kept")

    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        async with store.transaction() as conn:
            burned = await service.publish(conn, identity, "rolled back")
            raise Abort
    after = await publish(store, "next")
    log = await service.read(store, Window(after=0))
    assert [d.statement for d in log] == ["kept", "next"]
    # The number may be burned (PostgreSQL's sequence) or drawn again (SQLite), never shared.
    assert after.seq > first.seq and burned.seq > first.seq
    assert orjson.loads(segments(after.jws)[1])["seq"] == after.seq


async def test_publish_refuses_an_empty_statement(store: Store) -> None:
    for statement in ("", None, 1):
        with pytest.raises(errors.InvalidInput):
            await publish(store, statement)  # type: ignore[arg-type]
    assert await service.read(store, Window()) == []


async def test_a_key_that_cannot_sign_stores_nothing(store: Store) -> None:
    mismatched = SigningIdentity(keys.generate_pem("ed25519"), "ES256")
    with pytest.raises(AlgorithmMismatch):
        async with store.transaction() as conn:
            await service.publish(conn, mismatched, "s")
    assert await service.read(store, Window()) == []


async def test_get_raises_not_found(store: Store) -> None:
    with pytest.raises(service.DecisionNotFound) as raised:
        await service.get(store, 1)
    assert isinstance(raised.value, errors.NotFound)


@pytest.mark.parametrize("batched", [False, True], ids=["one-by-one", "batched"])
async def test_publishers_in_several_processes_never_share_a_number_and_pollers_miss_nothing(
    database_url: str, batched: bool
) -> None:
    """Separate engines stand in for separate gateway processes sharing one database.

    Numbers must also commit in the order they are drawn: a reader polling
    with ``after`` = the largest number it has seen must end with every
    Decision, which fails if a lower number can commit after a higher one.
    Batched, each process publishes its 25 at once through a Publisher.
    """
    stores = [Store(database_url) for _ in range(3)]
    reader = Store(database_url)
    done = asyncio.Event()
    seen: list[int] = []

    async def poll() -> None:
        while True:
            finished = done.is_set()
            page = await service.read(reader, Window(after=seen[-1] if seen else 0, limit=200))
            seen.extend(d.seq for d in page)
            if finished and not page:
                return
            await asyncio.sleep(0)

    async def publisher(store: Store, name: str) -> list[int]:
        if batched:
            publisher = service.Publisher(store, identity)
            published = await asyncio.gather(*(publisher.publish(f"{name}-{index}") for index in range(25)))
            return [decision.seq for decision in published]
        return [(await publish(store, f"{name}-{index}")).seq for index in range(25)]

    try:
        poller = asyncio.create_task(poll())
        results = await asyncio.gather(*(publisher(store, f"p{i}") for i, store in enumerate(stores)))
        done.set()
        await poller
        numbers = sorted(n for result in results for n in result)
        assert len(set(numbers)) == len(numbers) == 75
        log = [d.seq for d in await service.read(reader, Window(after=0, limit=200))]
        assert log == numbers
        assert seen == log
    finally:
        for store in (*stores, reader):
            await store.close()


async def test_a_publisher_numbers_concurrent_statements_in_the_order_they_came(store: Store) -> None:
    publisher = service.Publisher(store, identity)
    statements = [f"s{index}" for index in range(30)]
    published = await asyncio.gather(*(publisher.publish(statement) for statement in statements))
    assert [(d.seq, d.statement) for d in published] == list(enumerate(statements, start=1))
    assert [d.created_at for d in published] == sorted(d.created_at for d in published)
    for decision in published:
        assert orjson.loads(segments(decision.jws)[1]) == {
            "seq": decision.seq,
            "createdAt": decision.created_at,
            "statement": decision.statement,
        }
    assert await service.read(store, Window(after=0)) == published


async def test_a_publisher_refuses_an_empty_statement_alone(store: Store) -> None:
    publisher = service.Publisher(store, identity)
    outcomes = await asyncio.gather(*(publisher.publish(s) for s in ("a", "", "b")), return_exceptions=True)
    assert isinstance(outcomes[1], errors.InvalidInput)
    assert [d.statement for d in await service.read(store, Window(after=0))] == ["a", "b"]


# A ceiling for a wake-up from another process, never a duration.
WAKE_CEILING_S = 120.0


@pytest.mark.parametrize("through", ["transaction", "publisher"])
@pytest.mark.parametrize("delivering", [False, True], ids=["alone", "with-a-webhook-delivery"])
async def test_a_publish_wakes_the_log_watcher_only_when_watched_and_in_another_process_too(
    store: Store, database_url: str, delivering: bool, through: str
) -> None:
    """In a transaction, and through a Publisher (on PostgreSQL a statement alone, see Lease)."""
    write = service.Publisher(store, identity).publish if through == "publisher" else functools.partial(publish, store)
    other = Store(database_url)  # another process's, listening as the one that runs the loops does
    probe = other.subscribe("probe")
    other.listen()
    if other.dialect == "postgresql":
        # Connected, the listener wakes every channel once: subscribe only after that one.
        async with asyncio.timeout(WAKE_CEILING_S):
            await probe.wait(None)
    here, there = store.subscribe(decisions_queries.CHANNEL), other.subscribe(decisions_queries.CHANNEL)
    deliverers = other.subscribe(outbox.CHANNEL)
    try:
        if delivering:
            store.webhook_urls = {outbox.DECISION_PUBLISHED: ("http://127.0.0.1:9/hook",)}
        await write("unwatched")
        assert await here.wait(0) is False
        store.watched = frozenset({decisions_queries.CHANNEL})
        await write("watched")
        assert await here.wait(0) is True
        async with asyncio.timeout(WAKE_CEILING_S):
            assert await there.wait(None) is True
            if delivering:  # the deliverers' wake-up rides in the same statement on PostgreSQL
                assert await deliverers.wait(None) is True
    finally:
        store.unsubscribe(decisions_queries.CHANNEL, here)
        other.unsubscribe(decisions_queries.CHANNEL, there)
        other.unsubscribe(outbox.CHANNEL, deliverers)
        other.unsubscribe("probe", probe)
        await other.close()


async def test_a_page_embeds_each_statement_as_stored_byte_for_byte_as_encoding_it_would(store: Store) -> None:
    # service.page embeds the stored JSON text of each Statement instead of parsing and encoding it
    # again: the body must be exactly the one built from the parsed Decisions.
    statements = ["plain", 'quotes " and \\ backslash', "é ü 漢字 🎉", "line\nbreak\ttab\x01\x1f", "\u2028\u2029", "</script>", "s" * 10_000]
    for statement in statements:
        await publish(store, statement)
    window = Window(after=0, limit=50)
    body = await service.page(store, window)
    assert body == jsontext.dumps({"decisions": [decision.to_json() for decision in await service.read(store, window)]})
    assert [decision["statement"] for decision in orjson.loads(body)["decisions"]] == statements


# --- PostgreSQL: a Publisher's batches written alone under one Lease (store.queries.decisions) ----

# The lock in this test's database (other tests' databases have theirs).
_HERE = "locktype = 'advisory' AND objid = :key AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
_HELD = sa.text(f"SELECT count(*) FROM pg_locks WHERE {_HERE} AND granted = :granted")


async def _locks_held(store: Store, *, granted: bool = True) -> int:
    """Sessions holding (or waiting for) the lock that orders publishers."""
    [(held,)] = await store.fetch(direct.Query(_HELD), key=decisions_queries._PUBLISH_LOCK_KEY, granted=granted)
    return int(held)


async def _until_leased(store: Store, publisher: service.Publisher, statement: str) -> int:
    """Publish ``statement`` until a batch leaves the Lease holding the lock (the first batches go
    on a pooled connection while the Publisher's own opens, and let it go); the last number."""
    last = 0
    async with asyncio.timeout(WAKE_CEILING_S):
        while not await _locks_held(store):
            last = (await publisher.publish(statement)).seq
    return last


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_publisher_holds_the_lock_across_batches_then_gives_the_others_their_turn(
    store: Store, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches in a row draw no numbers under the Lease, while another process's publisher waits;
    after LEASE_BATCHES the lock goes to it, and the sequence is where the Lease left it."""
    monkeypatch.setattr(decisions_queries, "LEASE_BATCHES", 3)
    monkeypatch.setattr(decisions_queries, "LEASE_LINGER_S", WAKE_CEILING_S)  # only the cap releases here
    drawn = []
    real_run = direct.run

    async def counted(conn, query, **params):  # type: ignore[no-untyped-def]
        if query is decisions_queries._POSTGRES_LOCK_AND_NEXT:
            drawn.append(params["count"])
        return await real_run(conn, query, **params)

    monkeypatch.setattr(direct, "run", counted)
    publisher = service.Publisher(store, identity)
    other = Store(database_url)  # another process's publisher, in a transaction
    try:
        warm = await _until_leased(store, publisher, "warm")
        drawn.clear()  # the Lease's first batch was the last "warm"
        waiting = asyncio.create_task(publish(other, "the other's"))
        async with asyncio.timeout(WAKE_CEILING_S):
            while not await _locks_held(store, granted=False):  # the other waits for the lock
                await asyncio.sleep(0.01)
        first = await publisher.publish("a")
        assert not waiting.done()  # it cannot draw while the Lease holds the lock
        second = await publisher.publish("b")  # the third batch under the Lease: it lets go
        async with asyncio.timeout(WAKE_CEILING_S):
            theirs = await waiting
        third, after = await publisher.publish("c"), await publisher.publish("d")
        assert [d.seq - warm for d in [first, second, theirs, third, after]] == [1, 2, 3, 4, 5]
        assert drawn == [1]  # none under the Lease; one for "c", after the other's turn
        log = await service.read(store, Window(after=warm))
        assert [d.statement for d in log] == ["a", "b", "the other's", "c", "d"]
    finally:
        await other.close()


async def test_a_publisher_lets_the_lock_go_once_no_batch_comes(
    store: Store, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle, a Publisher holds nothing another process's publisher would wait for forever."""
    monkeypatch.setattr(decisions_queries, "LEASE_LINGER_S", 0.01)
    publisher = service.Publisher(store, identity)
    other = Store(database_url)
    try:
        await asyncio.gather(*(publisher.publish(f"s{n}") for n in range(4)))
        async with asyncio.timeout(WAKE_CEILING_S):
            theirs = await publish(other, "the other's")
            while store.dialect == "postgresql" and await _locks_held(store):
                await asyncio.sleep(0.01)
        assert theirs.seq == 5
        assert (await publisher.publish("again")).seq == 6
    finally:
        await other.close()


class _Refusing(SigningIdentity):
    """Signs nothing whose Statement says "refuse"."""

    def sign(self, payload: bytes, typ: str) -> str:
        if b"refuse" in payload:
            raise RuntimeError("refused to sign")
        return super().sign(payload, typ)


_HOLDER = sa.text(f"SELECT pid FROM pg_locks WHERE {_HERE} AND granted")
_SESSIONS = sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")


# The database refuses a Decision whose Statement is "refuse" (stored as JSON text): the statement
# fails in the server, and the session that ran it is as healthy as before.
_DATABASE_REFUSES = (
    """CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN IF NEW.statement = '"refuse"' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$""",
    "CREATE TRIGGER refuse BEFORE INSERT ON decisions FOR EACH ROW EXECUTE FUNCTION refuse()",
)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("refused_by", ["signing", "database"])
async def test_a_batch_that_fails_under_the_lease_ends_the_session_holding_the_lock_and_its_other_items_commit(
    store: Store, refused_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decisions_queries, "LEASE_LINGER_S", WAKE_CEILING_S)
    if refused_by == "database":
        publisher = service.Publisher(store, identity)
        async with store.transaction() as conn:
            for ddl in _DATABASE_REFUSES:
                await conn.execute(sa.text(ddl))
    else:
        publisher = service.Publisher(store, _Refusing(keys.generate_pem("ed25519")))
    await _until_leased(store, publisher, "held")
    [(holder,)] = await store.fetch(direct.Query(_HOLDER), key=decisions_queries._PUBLISH_LOCK_KEY)
    outcomes = await asyncio.gather(*(publisher.publish(s) for s in ("x", "refuse", "y")), return_exceptions=True)
    assert isinstance(outcomes[1], asyncpg.PostgresError if refused_by == "database" else RuntimeError)
    assert not isinstance(outcomes[0], Exception)
    async with asyncio.timeout(WAKE_CEILING_S):  # the server ends the failed batch's session, and its lock with it
        while (await store.fetch(direct.Query(_SESSIONS), pid=holder))[0][0]:
            await asyncio.sleep(0.01)
    log = [d for d in await service.read(store, Window(after=0)) if d.statement != "held"]
    assert [d.statement for d in log] == ["x", "y"]
    assert log[0].seq < log[1].seq
