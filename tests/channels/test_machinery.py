"""The channel machinery on both backends: identities, pairing, policies, the read position, the outbox."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from agent_gateway import clock
from agent_gateway.channels import identities, inbound, outbox, pairing, sender
from agent_gateway.channels.network import Network, SendFailed
from agent_gateway.messages import service as messages
from agent_gateway.signals import retention
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import channels as queries
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.store.tables import channel_deliveries, channel_pairings, messages as message_rows, signals as signal_rows
from agent_gateway.store.tables import channel_conversations as conversation_rows
from agent_gateway.store.tables import channel_shared_conversations as shared_conversation_rows
from agent_gateway.users import service as users
from agent_gateway.users.service import UserNotFound
from tests.webhooks.test_deliverer_leases import Ahead

ALICE = "matrix:@alice:example.org"
BOB = "matrix:@bob:example.org"
ROOM = "!room:example.org"


async def admitted(store: Store) -> str:
    async with store.transaction() as conn:
        return (await users.admit(conn)).id


async def linked(store: Store, identity: str = ALICE) -> str:
    user_id = await admitted(store)
    async with store.transaction() as conn:
        await identities.link(conn, user_id, identity)
    return user_id


async def rows(store: Store, table: sa.Table) -> list[sa.Row]:
    async with store.read() as conn:
        return list(await conn.execute(sa.select(table)))


async def deliveries(store: Store) -> list[queries.Delivery]:
    async with store.read() as conn:
        return list(reversed(await queries.newest(conn, limit=100)))


async def texts(store: Store, user_id: str) -> list[tuple[str, str]]:
    async with store.read() as conn:
        query = sa.select(message_rows.c.direction, message_rows.c.text).where(message_rows.c.user_id == user_id)
        return [tuple(row) for row in await conn.execute(query.order_by(message_rows.c.seq))]


# --- identities ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["alice", "matrix:", "matrix:alice", "irc:@a:b.org", "matrix:@a b:example.org", "matrix:@a:"])
def test_a_malformed_identity_is_refused(bad: str) -> None:
    with pytest.raises(identities.InvalidIdentity):
        identities.parse(bad)


def test_an_identity_names_its_channel_and_address() -> None:
    assert identities.parse("matrix:@alice:example.org:8448") == ("matrix", "@alice:example.org:8448")


async def test_link_unlink_and_list(store: Store) -> None:
    user_id = await linked(store)
    async with store.transaction() as conn:
        await identities.link(conn, user_id, BOB)
    async with store.read() as conn:
        assert [found.identity for found in await identities.of_user(conn, user_id)] == sorted([ALICE, BOB])
    async with store.transaction() as conn:
        await identities.unlink(conn, user_id, ALICE)
    async with store.read() as conn:
        assert [found.identity for found in await identities.of_user(conn, user_id)] == [BOB]


async def test_an_identity_belongs_to_one_user(store: Store) -> None:
    first = await linked(store)
    second = await admitted(store)
    with pytest.raises(identities.IdentityLinked, match="another User"):
        async with store.transaction() as conn:
            await identities.link(conn, second, ALICE)
    with pytest.raises(identities.IdentityLinked, match="this User"):
        async with store.transaction() as conn:
            await identities.link(conn, first, ALICE)
    async with store.read() as conn:
        assert [found.user_id for found in await identities.of_user(conn, first)] == [first]
        assert await identities.of_user(conn, second) == []


async def test_refusals_change_nothing(store: Store) -> None:
    user_id = await linked(store)
    nobody = "00000000-0000-4000-8000-000000000000"
    for refused, call in (
        (UserNotFound, lambda conn: identities.link(conn, nobody, BOB)),
        (UserNotFound, lambda conn: identities.unlink(conn, nobody, ALICE)),
        (identities.NotLinked, lambda conn: identities.unlink(conn, user_id, BOB)),
        (identities.InvalidIdentity, lambda conn: identities.link(conn, user_id, "bob")),
    ):
        with pytest.raises(refused):
            async with store.transaction() as conn:
                await call(conn)
    async with store.read() as conn:
        assert [found.identity for found in await identities.of_user(conn, user_id)] == [ALICE]


# --- pairing and the policies -----------------------------------------------------------------------


def text(address: str = "@alice:example.org", words: str = "hello", room: str = ROOM) -> inbound.Received:
    return inbound.Received(address, room, inbound.TEXT, words)


async def test_a_stranger_gets_one_code_and_nothing_is_stored(store: Store) -> None:
    outcomes = await inbound.record(store, "matrix", inbound.PAIRING, [text(), text(words="again")], "s1")
    assert outcomes == [inbound.PAIRING_REPLY, inbound.IGNORED]
    [request] = await rows(store, channel_pairings)
    assert len(request.code) == pairing.CODE_LENGTH and set(request.code) <= set(pairing.CODE_ALPHABET)
    assert request.identity == ALICE
    [reply] = await deliveries(store)
    assert (reply.kind, reply.identity, reply.state, reply.message_id) == ("notice", ALICE, "pending", None)
    async with store.transaction() as conn:
        [held] = await queries.claim_due(conn, channel="matrix", now="9999-01-01T00:00:00.000Z", lease="9999-01-01T00:00:00.000Z", limit=5)
        assert held.text == pairing.reply(request.code) and held.conversation == ROOM
        assert await queries.read_position(conn, "matrix") == "s1"
        assert await signal_queries.newest(conn, limit=10) == []
    assert await rows(store, message_rows) == []


async def test_a_stranger_who_mentions_the_agent_in_a_group_room_gets_the_code_in_a_direct_one(store: Store) -> None:
    """The code is sent in a conversation opened with the stranger, never in the group room; no
    User has a conversation from it."""
    mention = dataclasses.replace(text(words="@agent: hi", room="!group:x"), shared=True)
    assert await inbound.record(store, "matrix", inbound.PAIRING, [mention], "s1") == [inbound.PAIRING_REPLY]
    [request] = await rows(store, channel_pairings)
    network = FakeNetwork()
    await sender.Sender(store, network).step()
    assert network.opened == ["@alice:example.org"]
    assert [(conversation, kind, words) for conversation, kind, words, _ in network.sent] == [
        ("!opened1:example.org", "notice", pairing.reply(request.code))
    ]
    assert await rows(store, conversation_rows) == [] and await rows(store, shared_conversation_rows) == []


async def test_a_code_expires_after_an_hour_and_then_a_new_one_is_sent(store: Store) -> None:
    frozen = clock.FrozenClock("2026-11-28T04:00:00.000Z")
    with clock.use(frozen):
        await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s1")
        frozen.advance(minutes=59)
        assert await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s2") == [inbound.IGNORED]
        frozen.advance(minutes=1)
        assert await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s3") == [inbound.PAIRING_REPLY]
    assert len(await rows(store, channel_pairings)) == 1
    assert len(await deliveries(store)) == 2


async def test_pending_codes_are_capped_per_channel(store: Store) -> None:
    strangers = [text(f"@s{n}:example.org") for n in range(pairing.MAX_PENDING + 1)]
    outcomes = await inbound.record(store, "matrix", inbound.PAIRING, strangers, "s1")
    assert outcomes == [inbound.PAIRING_REPLY] * pairing.MAX_PENDING + [inbound.IGNORED]
    assert len(await rows(store, channel_pairings)) == pairing.MAX_PENDING


async def test_pairing_logs_no_message_text(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    await inbound.record(store, "matrix", inbound.PAIRING, [text(words="my secret words")], "s1")
    assert "pairing request from matrix:@alice:example.org" in caplog.text
    assert "my secret words" not in caplog.text


async def test_approve_admits_a_user_and_the_next_message_is_theirs(store: Store) -> None:
    await inbound.record(store, "matrix", inbound.PAIRING, [text(words="before")], "s1")
    [request] = await rows(store, channel_pairings)
    async with store.transaction() as conn:
        approved = await pairing.approve(conn, request.code.lower())
    assert approved.identity == ALICE and approved.admitted
    assert await rows(store, channel_pairings) == []
    assert await inbound.record(store, "matrix", inbound.PAIRING, [text(words="after")], "s2") == [inbound.STORED]
    # What was written before the approval never becomes a Message.
    assert await texts(store, approved.user_id) == [("inbound", "after")]
    async with store.read() as conn:
        [signal] = await signal_queries.newest(conn, limit=10)
    assert signal.kind == messages.RECEIVED and signal.payload["text"] == "after"


async def test_approve_can_link_to_an_existing_user(store: Store) -> None:
    user_id = await admitted(store)
    await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s1")
    [request] = await rows(store, channel_pairings)
    async with store.transaction() as conn:
        approved = await pairing.approve(conn, request.code, user_id)
    assert (approved.user_id, approved.admitted) == (user_id, False)


async def test_approve_and_deny_refusals_change_nothing(store: Store) -> None:
    frozen = clock.FrozenClock("2026-11-28T04:00:00.000Z")
    with clock.use(frozen):
        await inbound.record(store, "matrix", inbound.PAIRING, [text(), text("@bob:example.org")], "s1")
        codes = {row.identity: row.code for row in await rows(store, channel_pairings)}
        with pytest.raises(pairing.UnknownCode):
            async with store.transaction() as conn:
                await pairing.approve(conn, "ZZZZZZZZ")
        with pytest.raises(pairing.UnknownCode):
            async with store.transaction() as conn:
                await pairing.deny(conn, "short")
        with pytest.raises(UserNotFound):
            async with store.transaction() as conn:
                await pairing.approve(conn, codes[ALICE], "00000000-0000-4000-8000-000000000000")
        # Linked elsewhere meanwhile: the approval is refused, and admits no User.
        other = await linked(store, BOB)
        with pytest.raises(identities.IdentityLinked):
            async with store.transaction() as conn:
                await pairing.approve(conn, codes[BOB])
        async with store.read() as conn:
            assert [user.id for user in await users.list_newest(conn, 10)] == [other]
        frozen.advance(hours=1)
        with pytest.raises(pairing.UnknownCode, match="expired"):
            async with store.transaction() as conn:
                await pairing.approve(conn, codes[ALICE])
    assert {row.identity for row in await rows(store, channel_pairings)} == {ALICE, BOB}


async def test_deny_removes_the_request(store: Store) -> None:
    await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s1")
    [request] = await rows(store, channel_pairings)
    async with store.transaction() as conn:
        assert (await pairing.deny(conn, request.code)).identity == ALICE
    assert await rows(store, channel_pairings) == []
    async with store.read() as conn:
        assert await pairing.pending(conn) == []


async def test_allowlist_hears_only_linked_identities(store: Store) -> None:
    user_id = await linked(store)
    outcomes = await inbound.record(store, "matrix", inbound.ALLOWLIST, [text("@bob:example.org"), text()], "s1")
    assert outcomes == [inbound.IGNORED, inbound.STORED]
    assert await rows(store, channel_pairings) == []
    assert await deliveries(store) == []
    assert await texts(store, user_id) == [("inbound", "hello")]


async def test_open_admits_a_stranger_on_the_first_message(store: Store) -> None:
    outcomes = await inbound.record(store, "matrix", inbound.OPEN, [text(), text(words="second")], "s1")
    assert outcomes == [inbound.STORED, inbound.STORED]
    async with store.read() as conn:
        user_id = await identities.user_of(conn, ALICE)
    assert user_id is not None
    assert await texts(store, user_id) == [("inbound", "hello"), ("inbound", "second")]


async def test_only_text_is_read(store: Store) -> None:
    await linked(store)
    image = inbound.Received("@alice:example.org", ROOM, inbound.UNREADABLE)
    assert await inbound.record(store, "matrix", inbound.PAIRING, [image], "s1") == [inbound.REPLIED]
    [reply] = await deliveries(store)
    assert reply.kind == "notice"
    # A stranger's image gets no code and no reply.
    stranger = inbound.Received("@bob:example.org", ROOM, inbound.UNREADABLE)
    assert await inbound.record(store, "matrix", inbound.PAIRING, [stranger], "s2") == [inbound.IGNORED]


async def test_a_notice_said_once_is_said_once_in_its_conversation_across_reads(store: Store) -> None:
    await linked(store)
    cannot = inbound.Received("@alice:example.org", ROOM, inbound.UNREADABLE, "cannot read that", once=True)
    elsewhere = dataclasses.replace(cannot, conversation="!other:example.org")
    # As after a restart: each read is its own call, nothing remembered in between but the store.
    assert await inbound.record(store, "matrix", inbound.PAIRING, [cannot], "s1") == [inbound.REPLIED]
    assert await inbound.record(store, "matrix", inbound.PAIRING, [cannot], "s2") == [inbound.IGNORED]
    assert await inbound.record(store, "matrix", inbound.PAIRING, [elsewhere], "s3") == [inbound.REPLIED]
    assert [(d.kind, d.identity) for d in await deliveries(store)] == [("notice", ALICE), ("notice", ALICE)]


async def test_the_read_position_is_committed_with_what_was_stored(store: Store) -> None:
    user_id = await linked(store)
    await inbound.record(store, "matrix", inbound.PAIRING, [text(words="one")], "s1")
    # A read whose storing fails leaves no Message and the position where it was.
    broken = inbound.Received("@alice:example.org", ROOM, inbound.TEXT, "")
    with pytest.raises(messages.InvalidText):
        await inbound.record(store, "matrix", inbound.PAIRING, [text(words="two"), broken], "s2")
    assert await inbound.read_position(store, "matrix") == "s1"
    assert await texts(store, user_id) == [("inbound", "one")]


async def test_a_lost_numbering_race_is_retried_never_dropped(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    user_id = await linked(store)
    real, lost = messages.receive, []

    async def losing_once(conn, user, words):  # type: ignore[no-untyped-def]
        if not lost:
            lost.append(words)
            raise messages.LostRace()
        return await real(conn, user, words)

    monkeypatch.setattr(messages, "receive", losing_once)
    assert await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s1") == [inbound.STORED]
    assert await texts(store, user_id) == [("inbound", "hello")]


# --- the outbox: where outbound Messages go ---------------------------------------------------------


async def send(store: Store, user_id: str, words: str) -> None:
    async with store.transaction() as conn:
        await messages.send(conn, user_id, words)


async def test_no_channel_served_no_delivery(store: Store) -> None:
    user_id = await linked(store)
    await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s1")
    await send(store, user_id, "answer")
    assert await deliveries(store) == []


async def test_an_answer_goes_to_the_conversation_of_the_last_inbound_message(store: Store) -> None:
    store.channels = frozenset({"matrix"})
    user_id = await linked(store)
    await inbound.record(store, "matrix", inbound.PAIRING, [text(room="!first:x"), text(room="!second:x")], "s1")
    await send(store, user_id, "answer")
    [delivery] = await deliveries(store)
    assert (delivery.kind, delivery.message_id is not None, delivery.identity) == ("message", True, ALICE)
    async with store.transaction() as conn:
        [held] = await queries.claim_due(conn, channel="matrix", now="9999-01-01T00:00:00.000Z", lease="9999-01-01T00:00:00.000Z", limit=5)
    assert (held.conversation, held.text, held.user_id) == ("!second:x", "answer", user_id)


async def test_after_a_public_inbound_message_no_channel_sends(store: Store) -> None:
    store.channels = frozenset({"matrix"})
    user_id = await linked(store)
    await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s1")
    async with store.transaction() as conn:
        await messages.receive(conn, user_id, "from the chat page")
    await send(store, user_id, "answer")
    assert await deliveries(store) == []


async def test_in_one_batch_each_answer_follows_its_own_users_route(store: Store) -> None:
    # The writer batches concurrent Messages into one transaction (on PostgreSQL the statement
    # that writes them reads their routes too): a Public inbound Message earlier in the batch
    # is its User's most recent, and another User's Messages never take this one's route.
    store.channels = frozenset({"matrix"})
    alice = await linked(store)
    bob = await linked(store, BOB)
    await inbound.record(store, "matrix", inbound.PAIRING, [text(), text("@bob:example.org", room="!bob:x")], "s1")
    stranger = await admitted(store)
    async with store.transaction() as conn:
        await messages.append_many(conn, [
            messages.Draft(alice, messages.OUTBOUND, "to alice"),
            messages.Draft(bob, messages.INBOUND, "bob, from the chat page"),
            messages.Draft(stranger, messages.OUTBOUND, "to nobody on a channel"),
            messages.Draft(bob, messages.OUTBOUND, "to bob, on the chat page"),
        ])
    async with store.transaction() as conn:
        held = await queries.claim_due(conn, channel="matrix", now="9999-01-01T00:00:00.000Z", lease="9999-01-01T00:00:00.000Z", limit=5)
    assert [(one.user_id, one.conversation, one.text) for one in held] == [(alice, ROOM, "to alice")]


async def test_a_user_who_never_wrote_with_one_identity_gets_a_conversation_opened(store: Store) -> None:
    store.channels = frozenset({"matrix"})
    one = await linked(store)
    two = await linked(store, BOB)
    async with store.transaction() as conn:
        await identities.link(conn, two, "matrix:@carol:example.org")
    await send(store, one, "hello there")
    await send(store, two, "nobody knows where")
    [delivery] = await deliveries(store)
    async with store.transaction() as conn:
        [held] = await queries.claim_due(conn, channel="matrix", now="9999-01-01T00:00:00.000Z", lease="9999-01-01T00:00:00.000Z", limit=5)
    assert (held.identity, held.conversation, held.user_id) == (ALICE, None, one)


async def claimed_conversations(store: Store) -> list[tuple[str | None, str]]:
    """The (conversation, text) of every delivery, in order."""
    async with store.transaction() as conn:
        held = await queries.claim_due(conn, channel="matrix", now="9999-01-01T00:00:00.000Z", lease="9999-01-01T00:00:00.000Z", limit=50)
    return [(one.conversation, one.text) for one in held]


async def handling(store: Store, user_id: str | None, seq: int | None) -> None:
    """The Signal of ``user_id``'s inbound Message ``seq`` being handled, as the Signal Worker
    marks it (``processing``), every other one ended; ``seq`` None: none being handled."""
    async with store.transaction() as conn:
        found = await conn.execute(sa.select(signal_rows.c.id, signal_rows.c.payload))
        being = [id for id, payload in found if (payload["userId"], payload["seq"]) == (user_id, seq)]
        assert seq is None or len(being) == 1
        await conn.execute(sa.update(signal_rows).values(state=signal_queries.DONE))
        await conn.execute(sa.update(signal_rows).where(signal_rows.c.id.in_(being)).values(state=signal_queries.PROCESSING))


async def test_only_the_answer_to_a_message_in_a_shared_conversation_goes_back_there(store: Store) -> None:
    """alice asks privately, then mentions the agent in a group room: the answer to her private
    question (written while its Signal is handled), a message written when nothing of hers is
    handled (a Schedule's reminder), and one written while another User's Message is handled go
    to her direct room; only the answer to her group message goes to the group."""
    store.channels = frozenset({"matrix"})
    alice, bob = await linked(store), await linked(store, BOB)
    group = dataclasses.replace(text(words="@agent: and you?", room="!group:x"), shared=True)
    await inbound.record(store, "matrix", inbound.PAIRING, [text(room="!direct:x"), group, text("@bob:example.org")], "s1")
    await handling(store, alice, 1)
    await send(store, alice, "the private answer")
    await handling(store, None, None)
    await send(store, alice, "a reminder")
    await handling(store, bob, 1)
    await send(store, alice, "while bob is answered")
    await handling(store, alice, 2)
    await send(store, alice, "the group's answer")
    assert await claimed_conversations(store) == [
        ("!direct:x", "the private answer"), ("!direct:x", "a reminder"), ("!direct:x", "while bob is answered"),
        ("!group:x", "the group's answer"),
    ]
    # Each batch of the Messages' writer reads its Users' routes alike (on PostgreSQL, in the
    # statement that writes them): a batch of both Users' Messages, alice's group message handled.
    async with store.transaction() as conn:
        await messages.append_many(conn, [
            messages.Draft(bob, messages.OUTBOUND, "to bob"),
            messages.Draft(alice, messages.OUTBOUND, "the group's second answer"),
        ])
    assert (await claimed_conversations(store))[4:] == [(ROOM, "to bob"), ("!group:x", "the group's second answer")]


async def test_a_user_who_wrote_only_in_a_shared_conversation_gets_a_private_one_opened(store: Store) -> None:
    store.channels = frozenset({"matrix"})
    alice = await linked(store)
    group = dataclasses.replace(text(room="!group:x"), shared=True)
    await inbound.record(store, "matrix", inbound.PAIRING, [group], "s1")
    await send(store, alice, "a reminder")
    network = FakeNetwork()
    await sender.Sender(store, network).step()
    assert network.opened == ["@alice:example.org"]
    assert [(conversation, words) for conversation, _, words, _ in network.sent] == [("!opened1:example.org", "a reminder")]
    # The one opened is hers from now on; the group is still answered while its Message is handled.
    await send(store, alice, "another")
    await handling(store, alice, 1)
    await send(store, alice, "the answer")
    await sender.Sender(store, network).step()
    assert [(conversation, words) for conversation, _, words, _ in network.sent[1:]] == [
        ("!opened1:example.org", "another"), ("!group:x", "the answer"),
    ]
    # Unlinked: both conversations forgotten.
    async with store.transaction() as conn:
        await identities.unlink(conn, alice, ALICE)
        for table in (conversation_rows, shared_conversation_rows):
            assert (await conn.execute(sa.select(sa.func.count()).select_from(table))).scalar() == 0


async def test_a_private_conversation_found_shared_is_no_users_private_one_any_more(store: Store) -> None:
    """A read that finds a direct room shared (someone invited to it) forgets it as every User's
    private conversation, in its transaction, before its messages are taken: the next private
    Message opens another; a message read there now is recorded as shared."""
    store.channels = frozenset({"matrix"})
    alice, bob = await linked(store), await linked(store, BOB)
    await inbound.record(store, "matrix", inbound.PAIRING, [text(room="!direct:x"), text("@bob:example.org", room="!bob:x")], "s1")
    group = dataclasses.replace(text(words="@agent: hi all", room="!direct:x"), shared=True)
    await inbound.record(store, "matrix", inbound.PAIRING, [group], "s2", shared=["!direct:x"])
    forgotten = await conversation_of(store, alice)
    assert forgotten is not None and (forgotten.conversation, forgotten.inbound_seq) == (None, 1)
    held = await conversation_of(store, bob)
    assert held is not None and held.conversation == "!bob:x"
    await send(store, alice, "a reminder")
    await handling(store, alice, 2)
    await send(store, alice, "the answer")
    assert await claimed_conversations(store) == [(None, "a reminder"), ("!direct:x", "the answer")]
    # Another channel's conversation of the same name is not that room.
    async with store.transaction() as conn:
        await queries.set_conversation(conn, queries.Conversation(bob, "nostr", "nostr:" + "b" * 64, "!bob:x", 1, clock.now_iso()))
    await inbound.record(store, "matrix", inbound.PAIRING, [], "s3", shared=["!bob:x"])
    held = await conversation_of(store, bob)
    assert held is not None and held.channel == "nostr"


async def test_a_room_found_shared_is_found_through_its_index_not_a_scan_of_the_channels_users(store: Store) -> None:
    """Every read of a busy group room takes it off any User's private conversation: that statement
    finds the rows through ix_channel_conversations_channel_conversation (migration 0018), not by
    reading every User's row on the channel."""
    statement = queries.forgetting("matrix", ["!group:x", "!other:x"])
    async with store.read() as conn:
        compiled = statement.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        if store.dialect == "postgresql":
            await conn.exec_driver_sql("SET enable_seqscan = off")  # a table this small would be scanned
            plan = " ".join(row[0] for row in (await conn.exec_driver_sql(f"EXPLAIN {compiled}")).all())
        else:
            plan = " ".join(row[-1] for row in (await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}")).all())
    assert "ix_channel_conversations_channel_conversation" in plan, plan


async def test_a_user_whose_direct_room_is_found_shared_still_gets_their_messages_on_the_channel(store: Store) -> None:
    """alice wrote last in her direct room, which is then found shared: what the agent writes her
    next still goes to Matrix, in a private conversation opened for her (her last Message came by
    the channel), never to that room."""
    store.channels = frozenset({"matrix"})
    alice = await linked(store)
    await inbound.record(store, "matrix", inbound.PAIRING, [text(room="!direct:x")], "s1")
    await inbound.record(store, "matrix", inbound.PAIRING, [], "s2", shared=["!direct:x"])
    await send(store, alice, "later")
    network = FakeNetwork()
    await sender.Sender(store, network).step()
    assert [(conversation, words) for conversation, _, words, _ in network.sent] == [("!opened1:example.org", "later")]
    held = await conversation_of(store, alice)
    assert held is not None and (held.conversation, held.inbound_seq) == ("!opened1:example.org", 1)
    await send(store, alice, "and later")
    await sender.Sender(store, network).step()
    assert network.sent[-1][:3] == ("!opened1:example.org", "message", "and later") and len(network.opened) == 1


async def test_a_message_queued_for_a_room_found_shared_is_sent_to_a_private_one(store: Store) -> None:
    """Two Messages written for alice's direct room wait (one of them claimed in a batch behind
    another); a read then finds the room shared: neither is sent there, both go to a private
    conversation opened for her. An answer written for the room as her shared conversation stays."""
    store.channels = frozenset({"matrix"})
    alice = await linked(store)
    await inbound.record(store, "matrix", inbound.PAIRING, [text(room="!direct:x")], "s1")
    await send(store, alice, "queued")
    await send(store, alice, "claimed behind it")
    assert await claimed_conversations(store) == [("!direct:x", "queued"), ("!direct:x", "claimed behind it")]

    class FoundSharedWhileSending(FakeNetwork):
        async def send(self, conversation: str, kind: str, text: str, transaction_id: str) -> None:
            await super().send(conversation, kind, text, transaction_id)
            if len(self.sent) == 1:
                await inbound.record(store, "matrix", inbound.PAIRING, [], "s2", shared=["!direct:x"])

    async with store.transaction() as conn:  # due again: the claims above were the test's own
        await conn.execute(sa.update(channel_deliveries).values(next_attempt_at="2000-01-01T00:00:00.000Z"))
    network = FoundSharedWhileSending()
    await sender.Sender(store, network).step()
    # The first was under way when the read came; the second, claimed with it, was not yet.
    assert [(conversation, words) for conversation, _, words, _ in network.sent] == [
        ("!direct:x", "queued"), ("!opened1:example.org", "claimed behind it")
    ]
    held = await conversation_of(store, alice)
    assert held is not None and held.conversation == "!opened1:example.org"
    await send(store, alice, "waiting")
    group = dataclasses.replace(text(words="@agent: and here?", room="!direct:x"), shared=True)
    await inbound.record(store, "matrix", inbound.PAIRING, [group], "s3", shared=["!direct:x"])
    await handling(store, alice, 5)  # her log: the first question, three outbound, then this
    await send(store, alice, "the group's answer")
    await inbound.record(store, "matrix", inbound.PAIRING, [], "s4", shared=["!direct:x"])
    await sender.Sender(store, network).step()
    assert [(conversation, words) for conversation, _, words, _ in network.sent][2:] == [
        ("!opened1:example.org", "waiting"), ("!direct:x", "the group's answer")
    ]
    assert network.opened == ["@alice:example.org"]


async def conversation_of(store: Store, user_id: str) -> queries.Conversation | None:
    async with store.read() as conn:
        route = (await queries.routes(conn, [user_id])).get(user_id)
    return None if route is None else route.private


async def test_an_identity_moved_to_another_user_gets_none_of_the_first_users_answers(store: Store) -> None:
    """The first User keeps another identity; the moved one is paired with a second User: the first's
    answers, queued before the unlink or written after it, never go to the room the second reads."""
    store.channels = frozenset({"matrix"})
    first = await linked(store)
    async with store.transaction() as conn:
        await identities.link(conn, first, BOB)
    await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s1")
    await send(store, first, "queued before the unlink")
    async with store.transaction() as conn:
        await identities.unlink(conn, first, ALICE)
    second = await linked(store)
    await send(store, first, "written after the unlink")
    [ended] = await deliveries(store)
    assert (ended.identity, ended.state, ended.last_error) == (ALICE, "dead", identities.UNLINKED)
    assert await conversation_of(store, first) is None
    network = FakeNetwork()
    await sender.Sender(store, network).step()
    assert network.sent == [] and network.opened == []
    # The identity's new User writes and is answered in their own conversation.
    await inbound.record(store, "matrix", inbound.PAIRING, [text(room="!second:x")], "s2")
    await send(store, second, "to the second User")
    await sender.Sender(store, network).step()
    assert [(conversation, words) for conversation, _, words, _ in network.sent] == [("!second:x", "to the second User")]


async def test_a_conversation_on_an_identity_the_user_no_longer_holds_is_never_used(store: Store) -> None:
    """A conversation left on an identity unlinked meanwhile (as an attempt under way at the unlink
    may write it) is never sent into; a User who never wrote gets one opened on the identity they hold."""
    store.channels = frozenset({"matrix"})
    wrote, never = await linked(store), await linked(store, BOB)
    async with store.transaction() as conn:
        await identities.link(conn, wrote, "matrix:@carol:example.org")
        await identities.link(conn, never, "matrix:@dave:example.org")
    await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s1")
    async with store.transaction() as conn:
        await queries.set_conversation(conn, queries.Conversation(never, "matrix", BOB, "!bob:x", None, clock.now_iso()))
        for user_id, identity in ((wrote, ALICE), (never, BOB)):
            assert await queries.unlink(conn, identity=identity, user_id=user_id)  # the link alone
    await send(store, wrote, "to nobody on a channel")
    await send(store, never, "hello, dave")
    network = FakeNetwork()
    await sender.Sender(store, network).step()
    assert network.opened == ["@dave:example.org"]
    assert [(conversation, words) for conversation, _, words, _ in network.sent] == [("!opened1:example.org", "hello, dave")]
    held = await conversation_of(store, never)
    assert held is not None and (held.identity, held.conversation) == ("matrix:@dave:example.org", "!opened1:example.org")


async def test_a_claimed_delivery_ended_by_an_unlink_is_not_sent(store: Store) -> None:
    """Two answers claimed in one batch; the identity is unlinked while the first is being sent: the
    second is not sent."""
    store.channels = frozenset({"matrix"})
    user_id = await linked(store)
    async with store.transaction() as conn:
        await identities.link(conn, user_id, BOB)
    await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s1")
    await send(store, user_id, "first")
    await send(store, user_id, "second")

    class UnlinkingNetwork(FakeNetwork):
        async def send(self, conversation: str, kind: str, text: str, transaction_id: str) -> None:
            await super().send(conversation, kind, text, transaction_id)
            if len(self.sent) == 1:
                async with store.transaction() as conn:
                    await identities.unlink(conn, user_id, ALICE)

    network = UnlinkingNetwork()
    await sender.Sender(store, network).step()
    assert [words for _, _, words, _ in network.sent] == ["first"]
    # The first's outcome was not written (the unlink ended it while it was sent): both are dead.
    assert [(d.state, d.last_error) for d in await deliveries(store)] == [("dead", identities.UNLINKED)] * 2


# --- the sender ------------------------------------------------------------------------------------


class FakeNetwork(Network):
    name = "matrix"
    policy = inbound.PAIRING

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str, str, str]] = []
        self.opened: list[str] = []
        self.failing = False
        self.wrote = asyncio.Event()

    async def read(self) -> None:
        await asyncio.Event().wait()

    async def open_conversation(self, address: str) -> str:
        self.opened.append(address)
        return f"!opened{len(self.opened)}:example.org"

    async def send(self, conversation: str, kind: str, text: str, transaction_id: str) -> None:
        self.wrote.set()
        if self.failing:
            raise SendFailed("the homeserver is down")
        self.sent.append((conversation, kind, text, transaction_id))


async def test_the_sender_delivers_in_order_with_the_delivery_id_as_transaction_id(store: Store) -> None:
    store.channels = frozenset({"matrix"})
    user_id = await linked(store)
    await send(store, user_id, "first")
    await send(store, user_id, "second")
    network = FakeNetwork()
    await sender.Sender(store, network).step()
    assert [(conversation, text) for conversation, _, text, _ in network.sent] == [
        ("!opened1:example.org", "first"), ("!opened1:example.org", "second")
    ]
    assert network.opened == ["@alice:example.org"]  # one conversation opened, used by both
    stored = await deliveries(store)
    assert [d.state for d in stored] == ["delivered", "delivered"]
    assert [transaction for *_, transaction in network.sent] == [d.id for d in stored]
    # The next answer goes to the opened conversation without opening another.
    await send(store, user_id, "third")
    await sender.Sender(store, network).step()
    assert network.sent[-1][:3] == ("!opened1:example.org", "message", "third") and len(network.opened) == 1


async def test_a_failed_delivery_is_retried_with_backoff_capped_at_a_minute_then_dead(store: Store) -> None:
    store.channels = frozenset({"matrix"})
    user_id = await linked(store)
    await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s1")
    network = FakeNetwork()
    network.failing = True
    frozen = clock.FrozenClock("2026-11-28T04:00:00.000Z")
    with clock.use(frozen):
        await send(store, user_id, "answer")
        loop = sender.Sender(store, network)
        waits = []
        for _ in range(9):
            await loop.step()
            [delivery] = await deliveries(store)
            assert delivery.state == "failed" and delivery.last_error == "the homeserver is down"
            waits.append((clock.parse_instant(delivery.next_attempt_at) - frozen.instant).total_seconds())
            frozen.set(delivery.next_attempt_at)
        assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]
        frozen.advance(days=1)
        await loop.step()
        [delivery] = await deliveries(store)
        assert delivery.state == "dead"
        network.failing = False
        await loop.step()
    assert network.sent == []
    async with store.read() as conn:
        assert [d.id for d in await queries.newest(conn, limit=5, state="dead")] == [delivery.id]


async def test_a_delivery_is_sent_once_by_two_senders(store: Store) -> None:
    store.channels = frozenset({"matrix"})
    user_id = await linked(store)
    await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s1")
    for n in range(20):
        await send(store, user_id, f"answer {n}")
    first, second = FakeNetwork(), FakeNetwork()
    await asyncio.gather(sender.Sender(store, first).step(), sender.Sender(store, second).step())
    sent = sorted(text for network in (first, second) for _, _, text, _ in network.sent)
    assert sent == sorted(f"answer {n}" for n in range(20))


async def two_answers(store: Store) -> None:
    """A User paired on Matrix and two answers to them in the channel's outbox: "first", "second"."""
    store.channels = frozenset({"matrix"})
    user_id = await linked(store)
    await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s1")
    await send(store, user_id, "first")
    await send(store, user_id, "second")


async def test_an_attempt_late_in_its_batch_renews_its_lease_so_no_other_sender_takes_it(store: Store) -> None:
    """Two answers claimed in one batch; the first's send is slow (the clock moves past the batch's
    lease meanwhile). The second's lease is renewed before its attempt, so a second sender (after a
    change of leadership) looking during that attempt finds nothing due: each is sent once."""
    await two_answers(store)
    other, ahead = FakeNetwork(), Ahead()

    class SlowThenWatched(FakeNetwork):
        async def send(self, conversation: str, kind: str, text: str, transaction_id: str) -> None:
            await super().send(conversation, kind, text, transaction_id)
            if text == "first":  # as slow as an attempt may be, and the margin
                ahead.by = timedelta(seconds=sender.ATTEMPT_TIMEOUT_S + sender.LEASE_MARGIN_S + 1)
            else:
                [delivery] = [d for d in await deliveries(store) if d.id == transaction_id]
                assert clock.parse_instant(delivery.next_attempt_at) - clock.now() > timedelta(seconds=sender.ATTEMPT_TIMEOUT_S)
                await sender.Sender(store, other).step()

    first = SlowThenWatched()
    with clock.use(ahead):
        await sender.Sender(store, first).step()
    assert [words for _, _, words, _ in first.sent] == ["first", "second"]
    assert other.sent == []
    assert [d.state for d in await deliveries(store)] == ["delivered", "delivered"]


async def test_a_delivery_whose_lease_ran_out_and_another_sender_took_is_not_sent_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first answer's send is slow, and by the time it is recorded the batch's lease has run out
    and a second sender (after a change of leadership) has claimed and sent the second answer: the
    first sender, coming to it, finds its claim lost and does not send it again."""
    await two_answers(store)
    other, ahead = FakeNetwork(), Ahead()
    record = queries.record

    async def record_then_another_sender(store_, claimed, error, backoff):  # type: ignore[no-untyped-def]
        recorded = await record(store_, claimed, error, backoff)
        if claimed.text == "first":
            ahead.by = timedelta(seconds=sender.ATTEMPT_TIMEOUT_S + sender.LEASE_MARGIN_S + 1)
            await sender.Sender(store, other).step()
        return recorded

    monkeypatch.setattr(queries, "record", record_then_another_sender)
    superseded = {"channel": "matrix", "direction": "out", "outcome": "superseded"}
    before = REGISTRY.get_sample_value("agent_gateway_channel_messages_total", superseded) or 0.0
    first = FakeNetwork()
    with clock.use(ahead):
        await sender.Sender(store, first).step()
    assert [words for _, _, words, _ in first.sent] == ["first"]
    assert [words for _, _, words, _ in other.sent] == ["second"]
    assert REGISTRY.get_sample_value("agent_gateway_channel_messages_total", superseded) == before + 1
    assert [d.state for d in await deliveries(store)] == ["delivered", "delivered"]


def test_backoff_reaches_its_cap() -> None:
    start = clock.parse_instant("2026-11-28T04:00:00.000Z")
    following = [
        outbox_next(n, start) for n in (1, 7, 8, 30)
    ]
    assert following == [1.0, 60.0, 60.0, 60.0]


def outbox_next(attempts: int, now):  # type: ignore[no-untyped-def]
    from agent_gateway.store import outbox as shared

    at = shared.next_attempt(
        attempts, now, now, first_retry_s=sender.FIRST_RETRY_S, retry_for=timedelta(days=1),
        factor=sender.BACKOFF_FACTOR, max_wait_s=sender.MAX_RETRY_WAIT_S,
    )
    return (at - now).total_seconds()


async def test_the_channel_deliveries_are_listed_without_their_text(store: Store) -> None:
    await inbound.record(store, "matrix", inbound.PAIRING, [text(words="hello")], "s1")
    [delivery] = await outbox.newest(store, limit=5)
    shown = delivery.to_json()
    assert set(shown) == {
        "id", "channel", "identity", "kind", "message", "state", "attempts", "createdAt", "nextAttemptAt",
        "lastError", "deliveredAt",
    }
    assert shown["state"] == "pending" and shown["nextAttemptAt"] is not None
    assert await rows(store, channel_deliveries)


async def test_retention_takes_closed_channel_deliveries_and_never_an_open_one(store: Store) -> None:
    """retention.deliveries_max_age and ``agent-gateway prune`` cover this outbox as the webhooks'."""
    store.channels = frozenset({"matrix"})
    user_id = await linked(store)
    await inbound.record(store, "matrix", inbound.PAIRING, [text()], "s1")
    network = FakeNetwork()
    frozen = clock.FrozenClock("2026-11-28T04:00:00.000Z")
    with clock.use(frozen):
        await send(store, user_id, "delivered")
        await sender.Sender(store, network).step()
        network.failing = True
        await send(store, user_id, "dead")
        await sender.Sender(store, network).step()  # failed, retried in a second
        frozen.advance(days=1)
        await sender.Sender(store, network).step()  # a day on: dead
        await send(store, user_id, "pending")
        assert sorted(d.state for d in await deliveries(store)) == ["dead", "delivered", "pending"]
        frozen.advance(seconds=1)
        dry = await retention.prune(store, timedelta(0), dry_run=True)
        assert dry.outboxes["channelDeliveries"] == 2 and len(await deliveries(store)) == 3
        pruned = await retention.prune(store, timedelta(0))
    assert pruned.outboxes["channelDeliveries"] == 2
    assert [d.state for d in await deliveries(store)] == ["pending"]


# --- metrics ------------------------------------------------------------------------------------------


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_each_outcome_is_counted_in_the_channel_metrics(store: Store) -> None:
    """What the operator's dashboard reads (docs/operate/health-metrics.md): every inbound outcome, each
    pairing outcome, each delivery outcome, the outbox's depth and the delivery latency."""
    store.channels = frozenset({"matrix"})
    names = [
        ("agent_gateway_channel_messages_total", {"channel": "matrix", "direction": "in", "outcome": outcome})
        for outcome in ("stored", "pairing", "ignored", "replied")
    ] + [
        ("agent_gateway_channel_messages_total", {"channel": "matrix", "direction": "out", "outcome": outcome})
        for outcome in ("delivered", "failed")
    ] + [
        ("agent_gateway_channel_pairing_requests_total", {"channel": "matrix", "outcome": outcome})
        for outcome in ("issued", "pending")
    ] + [("agent_gateway_channel_delivery_latency_seconds_count", {"channel": "matrix"})]
    before = [sample(name, **labels) for name, labels in names]
    with clock.use(clock.FrozenClock(clock.now_iso())) as frozen:
        user_id = await linked(store)
        unreadable = inbound.Received("@alice:example.org", ROOM, inbound.UNREADABLE)
        stranger = text("@bob:example.org")
        await inbound.record(store, "matrix", inbound.PAIRING, [text(), unreadable, stranger, stranger], "s1")
        await send(store, user_id, "answer")
        network = FakeNetwork()
        network.failing = True
        loop = sender.Sender(store, network)
        await loop.step()  # three deliveries (the notice, the code, the answer): all fail
        assert sample("agent_gateway_channel_outbox_depth", channel="matrix") == 3
        network.failing = False
        frozen.advance(minutes=1)
        await loop.step()
    assert sample("agent_gateway_channel_outbox_depth", channel="matrix") == 0
    after = [sample(name, **labels) for name, labels in names]
    # in: stored, pairing, ignored, replied; out: delivered, failed; pairing: issued, pending; latency count
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 1, 1, 3, 3, 1, 1, 3]
