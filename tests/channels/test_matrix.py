"""The Matrix channel against a real homeserver (Synapse from PyPI), on both backends.

Each test registers fresh accounts (the agent's and the people's) on the session's one
homeserver, so no test sees another's rooms. Every wait has a ceiling of minutes.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import nio
import pytest
import sqlalchemy as sa

from agent_gateway.channels import identities, inbound, matrix, pairing
from agent_gateway.gateway import Gateway
from agent_gateway.ops import metrics
from agent_gateway.store.queries import channels as queries
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.store.tables import (
    channel_conversations,
    channel_pairings,
    messages,
    signals,
    users,
)
from agent_gateway.users import service as users_service
from tests import servers
from tests.channels.conftest import Deployment, Person, store_and_kill, until
from tests.served import ServedGateway

pytestmark = pytest.mark.processes


async def joined(person: Person, room_id: str, agent: str) -> None:
    await until(lambda: _has(person.members(room_id), agent), what=f"{agent} joining")


async def _has(members, who: str) -> bool:  # type: ignore[no-untyped-def]
    return who in await members


async def log_of(gateway: Gateway, user_id: str) -> list[tuple[str, str]]:
    async with gateway.store.read() as conn:
        query = sa.select(messages.c.direction, messages.c.text).where(messages.c.user_id == user_id).order_by(messages.c.seq)
        return [tuple(row) for row in await conn.execute(query)]


async def count(gateway: Gateway, table: sa.Table) -> int:
    async with gateway.store.read() as conn:
        return int((await conn.execute(sa.select(sa.func.count()).select_from(table))).scalar() or 0)


async def approve_all(gateway: Gateway) -> str:
    async with gateway.store.transaction() as conn:
        [request] = await pairing.pending(conn)
        return (await pairing.approve(conn, request.code)).user_id


async def heard_from_agent(person: Person, room_id: str, agent: str, n: int) -> list[tuple[str, str]]:
    async def enough() -> list[tuple[str, str]]:
        said = await person.heard(room_id, agent)
        return said if len(said) >= n else []

    return await until(enough, what=f"{n} messages from the agent")


async def paired(deployment: Deployment, gateway: Gateway, person: Person) -> tuple[str, str]:
    """A direct room of ``person`` with the agent, and the User the operator admitted for them,
    who has written there once and had the echo (the agent's messages: the code, the echo)."""
    room = await person.direct_room(deployment.agent)
    await joined(person, room, deployment.agent)
    await person.say(room, "hello?")
    await heard_from_agent(person, room, deployment.agent, 1)
    user_id = await approve_all(gateway)
    await person.say(room, "ping")
    await heard_from_agent(person, room, deployment.agent, 2)
    return room, user_id


async def test_the_whole_flow(deployment: Deployment, people, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    gateway = await deployment.start()
    alice = people()
    room = await alice.direct_room(deployment.agent)
    await joined(alice, room, deployment.agent)

    # A stranger: one pairing code, nothing stored, no User admitted.
    await alice.say(room, "hello, agent")
    [(kind, reply)] = await heard_from_agent(alice, room, deployment.agent, 1)
    assert kind == "m.notice"
    [request] = await pending(gateway)
    assert request.code in reply and request.identity == f"matrix:{alice.user_id}"
    assert await count(gateway, users) == 0 and await count(gateway, messages) == 0
    # While the code is pending, no new one.
    already = pending_count()
    await alice.say(room, "are you there?")
    await until(lambda: asyncio.sleep(0, pending_count() > already), what="the second message read")

    # Approved: the next message is an inbound Message and the echo agent's answer arrives.
    user_id = await approve_all(gateway)
    await alice.say(room, "ping")
    said = await heard_from_agent(alice, room, deployment.agent, 2)
    assert said[1] == ("m.text", "echo: ping")
    assert await log_of(gateway, user_id) == [("inbound", "ping"), ("outbound", "echo: ping")]

    # An outbound Message posted on the Agent server arrives once, its body exactly its text.
    await gateway.messages.send(user_id, "a word from the agent, *as written*")
    said = await heard_from_agent(alice, room, deployment.agent, 3)
    assert said[2] == ("m.text", "a word from the agent, *as written*")
    await until(lambda: all_delivered(gateway), what="every delivery delivered")
    assert len(await alice.heard(room, deployment.agent)) == 3

    # An image gets one polite reply.
    await alice.say(room, "photo.png", msgtype="m.image", url="mxc://localhost/nothing")
    said = await heard_from_agent(alice, room, deployment.agent, 4)
    assert said[3][0] == "m.notice" and "only read text" in said[3][1]

    token = deployment.settings.matrix_access_token_file.read_text().strip()  # type: ignore[union-attr]
    assert token not in caplog.text
    assert all(token not in str(record.__dict__) for record in caplog.records)


def pending_count() -> float:
    """How many messages of strangers with a pending code this process's channels have read."""
    return metrics.channel_pairing_requests.labels("matrix", "pending")._value.get()


async def pending(gateway: Gateway) -> list[queries.Pairing]:
    async with gateway.store.read() as conn:
        return await pairing.pending(conn)


async def all_delivered(gateway: Gateway) -> bool:
    async with gateway.store.read() as conn:
        found = await queries.newest(conn, limit=100)
    return all(d.state == "delivered" for d in found)


async def test_history_from_before_the_first_connection_is_never_taken(deployment: Deployment, people) -> None:  # type: ignore[no-untyped-def]
    alice = people()
    room = await alice.direct_room(deployment.agent)
    await alice.say(room, "written before the gateway ever connected")
    gateway = await deployment.start()
    await joined(alice, room, deployment.agent)
    await alice.say(room, "now")
    [(kind, _)] = await heard_from_agent(alice, room, deployment.agent, 1)
    assert kind == "m.notice"
    assert len(await pending(gateway)) == 1


async def test_messages_written_while_the_gateway_is_stopped_are_taken_once_in_order(deployment: Deployment, people) -> None:  # type: ignore[no-untyped-def]
    gateway = await deployment.start()
    alice = people()
    room, user_id = await paired(deployment, gateway, alice)
    await deployment.stop(gateway)
    await alice.say(room, "one")
    await alice.say(room, "two")
    gateway = await deployment.start()
    await until(lambda: answered(gateway, user_id, 3), what="both answers")
    assert [text for direction, text in await log_of(gateway, user_id) if direction == "inbound"] == ["ping", "one", "two"]
    said = await heard_from_agent(alice, room, deployment.agent, 4)
    assert said[2:] == [("m.text", "echo: one"), ("m.text", "echo: two")]


async def answered(gateway: Gateway, user_id: str, n: int) -> bool:
    return len([d for d, _ in await log_of(gateway, user_id) if d == "outbound"]) >= n


async def test_an_answer_written_while_the_homeserver_is_down_is_delivered_once_when_it_returns(
    deployment: Deployment, people, running_homeserver: servers.Homeserver  # type: ignore[no-untyped-def]
) -> None:
    gateway = await deployment.start()
    alice = people()
    room, user_id = await paired(deployment, gateway, alice)
    assert gateway.channels_status() == {"matrix": "ok"}
    running_homeserver.stop()
    await gateway.messages.send(user_id, "while you were away")
    await until(lambda: has_state(gateway, "failed"), what="a failed attempt")
    # /readyz shows it, and the process stays ready (ops.routes).
    assert gateway.channels_status()["matrix"].startswith("cannot reach the matrix server")
    running_homeserver.restart()
    said = await heard_from_agent(alice, room, deployment.agent, 3)
    await until(lambda: all_delivered(gateway), what="the delivery")
    assert (await alice.heard(room, deployment.agent))[2:] == [("m.text", "while you were away")]
    assert said[2] == ("m.text", "while you were away")


async def has_state(gateway: Gateway, state: str) -> bool:
    async with gateway.store.read() as conn:
        return bool(await queries.newest(conn, limit=1, state=state))


async def test_a_message_stored_but_not_sent_is_sent_after_a_restart_once(deployment: Deployment, people) -> None:  # type: ignore[no-untyped-def]
    gateway = await deployment.start()
    alice = people()
    room, user_id = await paired(deployment, gateway, alice)
    await deployment.stop(gateway)
    # What a gateway killed between storing the Message and sending it leaves: the Message and its
    # delivery, committed together, and nothing sent.
    from agent_gateway.messages import service as message_service
    from agent_gateway.store.engine import Store

    store = Store(deployment.settings.database_url)
    store.channels = frozenset({"matrix"})
    try:
        async with store.transaction() as conn:
            await message_service.send(conn, user_id, "stored, then killed")
    finally:
        await store.close()
    gateway = await deployment.start()
    said = await heard_from_agent(alice, room, deployment.agent, 3)
    await until(lambda: all_delivered(gateway), what="the delivery")
    assert said[2:] == [("m.text", "stored, then killed")]
    assert len(await alice.heard(room, deployment.agent)) == 3


async def test_allowlist_hears_only_linked_people(deployment: Deployment, people) -> None:  # type: ignore[no-untyped-def]
    gateway = await deployment.start(matrix_policy="allowlist")
    alice, bob = people(), people()
    from agent_gateway.channels import identities
    from agent_gateway.users import service as users_service

    async with gateway.store.transaction() as conn:
        user_id = (await users_service.admit(conn)).id
        await identities.link(conn, user_id, f"matrix:{alice.user_id}")
    alice_room, bob_room = await alice.direct_room(deployment.agent), await bob.direct_room(deployment.agent)
    await joined(alice, alice_room, deployment.agent)
    await joined(bob, bob_room, deployment.agent)  # the policy decides what it hears, not what it joins
    await bob.say(bob_room, "hello from a stranger")
    await alice.say(alice_room, "ping")
    assert await heard_from_agent(alice, alice_room, deployment.agent, 1) == [("m.text", "echo: ping")]
    assert await bob.heard(bob_room, deployment.agent) == []
    assert await count(gateway, channel_pairings) == 0 and await count(gateway, users) == 1


async def test_open_admits_strangers_and_no_user_hears_another(deployment: Deployment, people) -> None:  # type: ignore[no-untyped-def]
    gateway = await deployment.start(matrix_policy="open")
    alice, bob = people(), people()
    alice_room, bob_room = await alice.direct_room(deployment.agent), await bob.direct_room(deployment.agent)
    await joined(alice, alice_room, deployment.agent)
    await joined(bob, bob_room, deployment.agent)
    await alice.say(alice_room, "I am alice")
    await bob.say(bob_room, "I am bob")
    assert await heard_from_agent(alice, alice_room, deployment.agent, 1) == [("m.text", "echo: I am alice")]
    assert await heard_from_agent(bob, bob_room, deployment.agent, 1) == [("m.text", "echo: I am bob")]
    assert await count(gateway, users) == 2
    # Still only their own, after both answers went out.
    await until(lambda: all_delivered(gateway), what="both deliveries")
    assert await alice.heard(alice_room, deployment.agent) == [("m.text", "echo: I am alice")]
    assert await bob.heard(bob_room, deployment.agent) == [("m.text", "echo: I am bob")]


async def test_a_user_who_never_wrote_gets_a_direct_room(deployment: Deployment, people) -> None:  # type: ignore[no-untyped-def]
    gateway = await deployment.start()
    alice = people()
    from agent_gateway.channels import identities
    from agent_gateway.users import service as users_service

    async with gateway.store.transaction() as conn:
        user_id = (await users_service.admit(conn)).id
        await identities.link(conn, user_id, f"matrix:{alice.user_id}")
    await gateway.messages.send(user_id, "hello, first")
    [room] = await until(alice.invites, what="an invite")
    await alice.join(room)
    assert await heard_from_agent(alice, room, deployment.agent, 1) == [("m.text", "hello, first")]


async def test_an_encrypted_room_is_told_once_that_the_agent_cannot_read_it(  # type: ignore[no-untyped-def]
    deployment: Deployment, people, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = await deployment.start()
    alice = people()
    room, _ = await paired(deployment, gateway, alice)
    # The first sync holding the encrypted messages fails to store (the database went away, say):
    # read again, it still tells the room.
    real, failed = inbound.record, []

    async def failing_once(store, channel, policy, read, position, **more):  # type: ignore[no-untyped-def]
        if not failed and any(received.text == matrix.CANNOT_DECRYPT for received in read):
            failed.append(channel)
            raise ConnectionError("the database went away")
        return await real(store, channel, policy, read, position, **more)

    monkeypatch.setattr(inbound, "record", failing_once)
    # What an encrypting client sends (no library here can encrypt: the ciphertext is never read).
    scrambled = {
        "algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgAEnAc", "device_id": "ALICEDEVICE",
        "sender_key": "c2VuZGVyIGtleSBub3QgcmVhbA", "session_id": "c2Vzc2lvbiBub3QgcmVhbA",
    }
    for _ in range(2):
        answer = await alice.client.room_send(room, "m.room.encrypted", scrambled)
        assert isinstance(answer, nio.RoomSendResponse), answer
    # A text afterwards is answered after the notice (the outbox sends in order): once its answer
    # is heard, everything before it has been read and sent.
    await alice.say(room, "in clear?")
    said = await until(lambda: heard_text(alice, room, deployment.agent, "echo: in clear?"), what="the answer")
    assert failed == ["matrix"]
    assert said[2][0] == "m.notice" and "cannot read encrypted messages" in said[2][1]
    assert said[3:] == [("m.text", "echo: in clear?")]
    await until(lambda: all_delivered(gateway), what="the notice delivered")
    # After a restart, another encrypted message: no second notice. A text afterwards is answered,
    # so everything before it has been read.
    await deployment.stop(gateway)
    gateway = await deployment.start()
    answer = await alice.client.room_send(room, "m.room.encrypted", scrambled)
    assert isinstance(answer, nio.RoomSendResponse), answer
    await alice.say(room, "still there?")
    said = await heard_from_agent(alice, room, deployment.agent, 5)
    assert said[2:] == [said[2], ("m.text", "echo: in clear?"), ("m.text", "echo: still there?")]


async def heard_text(person: Person, room_id: str, agent: str, text: str) -> list[tuple[str, str]]:
    """What ``agent`` said in ``room_id`` once it said ``text``; empty until then."""
    said = await person.heard(room_id, agent)
    return said if ("m.text", text) in said else []


async def test_an_identity_moved_to_another_user_never_gets_the_first_users_answers(  # type: ignore[no-untyped-def]
    deployment: Deployment, people
) -> None:
    """The operator unlinks alice from her User (who keeps another identity) and links her to a
    new User: the first User's answers never reach alice's room; the second User's do."""
    gateway = await deployment.start()
    alice = people()
    room, first = await paired(deployment, gateway, alice)
    async with gateway.store.transaction() as conn:
        await identities.link(conn, first, "matrix:@elsewhere:example.org")
        await identities.unlink(conn, first, f"matrix:{alice.user_id}")
        second = (await users_service.admit(conn)).id
        await identities.link(conn, second, f"matrix:{alice.user_id}")
    written = await gateway.messages.send(first, "for the first User only")
    await alice.say(room, "who am I now?")
    # The outbox sends in order: the first User's answer, had it been written there, would come first.
    said = await until(lambda: heard_text(alice, room, deployment.agent, "echo: who am I now?"), what="the answer")
    assert said[2:] == [("m.text", "echo: who am I now?")]
    await until(lambda: all_delivered(gateway), what="every delivery delivered")
    async with gateway.store.read() as conn:
        assert written.id not in [d.message_id for d in await queries.newest(conn, limit=100)]
    assert await log_of(gateway, second) == [("inbound", "who am I now?"), ("outbound", "echo: who am I now?")]


async def group_room(deployment: Deployment, alice: Person, bob: Person) -> str:
    """A room alice made with bob and the agent, all three joined."""
    room = await alice.group_room(deployment.agent, bob.user_id)
    await bob.join(room)
    await joined(alice, room, deployment.agent)
    return room


async def test_in_a_group_room_only_mentions_are_heard(deployment: Deployment, people) -> None:  # type: ignore[no-untyped-def]
    gateway = await deployment.start(matrix_policy="open")
    alice, bob = people(), people()
    room = await group_room(deployment, alice, bob)
    await alice.say(room, "just talking among ourselves")
    await alice.say(room, f"{deployment.agent}: what do you think?")
    said = await heard_from_agent(alice, room, deployment.agent, 1)
    assert said == [("m.text", f"echo: {deployment.agent}: what do you think?")]
    assert await count(gateway, users) == 1


async def test_a_stranger_mentioning_the_agent_in_a_group_room_gets_the_code_in_a_direct_one(deployment: Deployment, people) -> None:  # type: ignore[no-untyped-def]
    """Under pairing, bob (a stranger) mentions the agent in a group room with alice: his code comes
    in a direct room the agent opens with him; no one in the group reads it."""
    gateway = await deployment.start()  # pairing, the default
    alice, bob = people(), people()
    group = await group_room(deployment, alice, bob)
    await bob.say(group, f"{deployment.agent}: may I talk to you?")
    [opened] = await until(bob.invites, what="an invite to a direct room")
    await bob.join(opened)
    [(kind, words)] = await heard_from_agent(bob, opened, deployment.agent, 1)
    [request] = await pending(gateway)
    assert (kind, words) == ("m.notice", pairing.reply(request.code))
    await until(lambda: all_delivered(gateway), what="every delivery delivered")
    assert await alice.heard(group, deployment.agent) == [] and await bob.heard(group, deployment.agent) == []


async def test_a_group_room_down_to_two_members_is_direct_again(deployment: Deployment, people) -> None:  # type: ignore[no-untyped-def]
    """bob leaves the group room alice made with him and the agent: from then on everything alice
    writes there is heard, not only mentions, and it is her direct room."""
    gateway = await deployment.start(matrix_policy="open")
    alice, bob = people(), people()
    room = await group_room(deployment, alice, bob)
    await alice.say(room, "among ourselves")
    answer = await bob.client.room_leave(room)
    assert isinstance(answer, nio.RoomLeaveResponse), answer
    # A mention is heard either way: once answered, the agent has read past bob's leaving.
    await alice.say(room, f"{deployment.agent}: still there?")
    await heard_from_agent(alice, room, deployment.agent, 1)
    await alice.say(room, "just us now")
    said = await heard_from_agent(alice, room, deployment.agent, 2)
    assert said == [("m.text", f"echo: {deployment.agent}: still there?"), ("m.text", "echo: just us now")]
    await gateway.messages.send(await the_only_user(gateway), "and a reminder")
    assert (await heard_from_agent(alice, room, deployment.agent, 3))[2] == ("m.text", "and a reminder")


async def answered_in_a_direct_room(deployment: Deployment, person: Person, words: str) -> str:
    """A direct room of ``person`` with the agent, where they wrote ``words`` and heard the echo."""
    room = await person.direct_room(deployment.agent)
    await joined(person, room, deployment.agent)
    await person.say(room, words)
    await heard_from_agent(person, room, deployment.agent, 1)
    return room


async def the_only_user(gateway: Gateway) -> str:
    async with gateway.store.read() as conn:
        [user_id] = (await conn.execute(sa.select(users.c.id))).scalars()
    return user_id


async def all_handled(gateway: Gateway) -> bool:
    """Every Signal handled: an outbound Message written now answers no Message (a Run that is
    still ``processing``, behind under load or left by a leader that lost its lock, would make it
    the answer to the one in the group room, which goes there)."""
    async with gateway.store.read() as conn:
        return not (await conn.execute(sa.select(signals.c.id).where(signals.c.state.in_([signal_queries.PENDING, signal_queries.PROCESSING])))).first()


async def test_a_users_other_messages_never_go_to_a_group_room_they_wrote_in(deployment: Deployment, people) -> None:  # type: ignore[no-untyped-def]
    """alice talks to the agent in a direct room, then mentions it in a group room with bob: the
    group gets the answer to her mention; what the agent writes her afterwards goes to her direct
    room, and bob never reads it."""
    gateway = await deployment.start(matrix_policy="open")
    alice, bob = people(), people()
    direct = await answered_in_a_direct_room(deployment, alice, "privately")
    group = await group_room(deployment, alice, bob)
    await alice.say(group, f"{deployment.agent}: and in the group?")
    assert await heard_from_agent(bob, group, deployment.agent, 1) == [("m.text", f"echo: {deployment.agent}: and in the group?")]
    await until(lambda: all_handled(gateway), what="every Signal handled")
    await gateway.messages.send(await the_only_user(gateway), "a reminder, for alice only")
    said = await until(lambda: heard_text(alice, direct, deployment.agent, "a reminder, for alice only"), what="the reminder")
    assert said == [("m.text", "echo: privately"), ("m.text", "a reminder, for alice only")]
    await until(lambda: all_delivered(gateway), what="every delivery delivered")
    assert await bob.heard(group, deployment.agent) == [("m.text", f"echo: {deployment.agent}: and in the group?")]


async def invite(alice: Person, bob: Person, room: str) -> None:
    """bob invited into alice's ``room``, and joined."""
    answer = await alice.client.room_invite(room, bob.user_id)
    assert isinstance(answer, nio.RoomInviteResponse), answer
    await bob.join(room)


async def sent_in_a_new_direct_room(deployment: Deployment, gateway: Gateway, alice: Person, room: str, words: str) -> None:
    """The operator's Message ``words`` to alice (the only User) opens a direct room other than
    ``room``, where she reads it; every delivery delivered after."""
    await gateway.messages.send(await the_only_user(gateway), words)
    [opened] = await until(alice.invites, what="an invite to a new direct room")
    await alice.join(opened)
    assert opened != room
    assert await heard_from_agent(alice, opened, deployment.agent, 1) == [("m.text", words)]
    await until(lambda: all_delivered(gateway), what="every delivery delivered")


async def test_a_direct_room_someone_is_invited_to_is_no_longer_private(deployment: Deployment, people) -> None:  # type: ignore[no-untyped-def]
    """alice's direct room gets bob as a third member: only mentions are heard there now, the
    answer to one goes there, and a later Message to her opens a new direct room, never read by bob."""
    gateway = await deployment.start(matrix_policy="open")
    alice, bob = people(), people()
    room = await answered_in_a_direct_room(deployment, alice, "just us")
    await invite(alice, bob, room)
    await alice.say(room, "bob, this is between us")  # no longer heard: they talk among themselves
    await alice.say(room, f"{deployment.agent}: and now?")
    await heard_from_agent(bob, room, deployment.agent, 2)
    await until(lambda: all_handled(gateway), what="every Signal handled")
    await sent_in_a_new_direct_room(deployment, gateway, alice, room, "for alice only")
    assert await bob.heard(room, deployment.agent) == [
        ("m.text", "echo: just us"), ("m.text", f"echo: {deployment.agent}: and now?"),
    ]


async def found_shared(gateway: Gateway, room: str) -> bool:
    """The gateway has read that ``room`` is no one's private room any more."""
    async with gateway.store.read() as conn:
        found = (await conn.execute(sa.select(channel_conversations.c.conversation))).scalars().all()
    return room not in found


async def test_a_user_whose_direct_room_gains_a_member_still_gets_the_agents_messages(deployment: Deployment, people) -> None:  # type: ignore[no-untyped-def]
    """alice's direct room gets bob, and alice says nothing more: the agent's next Message to her
    still reaches her on Matrix, in a new direct room, and bob never reads it (before, once the
    room was found shared, nothing the agent wrote her went to Matrix until she wrote again)."""
    gateway = await deployment.start(matrix_policy="open")
    alice, bob = people(), people()
    room = await answered_in_a_direct_room(deployment, alice, "just us")
    await invite(alice, bob, room)
    await until(lambda: found_shared(gateway, room), what="the room read as shared")
    await sent_in_a_new_direct_room(deployment, gateway, alice, room, "for alice only")
    assert await bob.heard(room, deployment.agent) == [("m.text", "echo: just us")]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # several processes share PostgreSQL only
async def test_two_processes_never_send_one_delivery_twice(deployment: Deployment, people) -> None:  # type: ignore[no-untyped-def]
    first = await deployment.start()
    second = await deployment.start()
    alice = people()
    room, user_id = await paired(deployment, first, alice)
    for n in range(10):
        await (first if n % 2 else second).messages.send(user_id, f"answer {n}")
    await heard_from_agent(alice, room, deployment.agent, 12)
    await until(lambda: all_delivered(first), what="every delivery")
    await asyncio.sleep(1)  # proving nothing more arrives: a second copy would come now
    said = await alice.heard(room, deployment.agent)
    assert sorted(body for _, body in said[2:]) == sorted(f"answer {n}" for n in range(10))


async def test_a_gateway_killed_between_storing_and_sending_sends_after_restart_once(  # type: ignore[no-untyped-def]
    running_homeserver: servers.Homeserver, people, database_url: str, tmp_path: Path
) -> None:
    """A real ``serve`` killed with SIGKILL while its outbound Message is stored and not yet sent
    (the homeserver is down, so no attempt can succeed): the next ``serve`` sends it, once."""
    agent, token = running_homeserver.register()
    (tmp_path / "matrix-token").write_text(token)
    env = {
        "AGENT_GATEWAY_CHANNELS_MATRIX_HOMESERVER": running_homeserver.url,
        "AGENT_GATEWAY_CHANNELS_MATRIX_USER_ID": agent,
        "AGENT_GATEWAY_CHANNELS_MATRIX_ACCESS_TOKEN_FILE": str(tmp_path / "matrix-token"),
    }
    alice = people()
    directory = tmp_path / "deployment"
    with ServedGateway.start(directory, database_url, env) as first:
        user_id = first.cli_json("users", "add")["id"]
        assert first.cli("users", "link", user_id, f"matrix:{alice.user_id}").returncode == 0
        running_homeserver.stop()
        await store_and_kill(first, user_id)
    running_homeserver.restart()
    # The same deployment on the same database, on new ports.
    second = ServedGateway.spawn_on_free_ports(directory, first.env)
    try:
        [room] = await until(alice.invites, what="an invite")
        await alice.join(room)
        assert await heard_from_agent(alice, room, agent, 1) == [("m.text", "stored, then killed")]

        async def delivered() -> bool:
            return [d["state"] for d in second.cli_json("channels", "deliveries")] == ["delivered"]

        await until(delivered, what="the delivery recorded as delivered")
        assert await alice.heard(room, agent) == [("m.text", "stored, then killed")]
    finally:
        second.stop()


async def test_the_channels_sync_is_not_woken_by_typing_or_receipts(people) -> None:  # type: ignore[no-untyped-def]
    # A person's client sends a typing notification and a read receipt around each message:
    # the channel's filter leaves them out, so they end no long poll of the agent's sync.
    person, agent = people(), people()
    room = await person.direct_room(agent.user_id)
    await agent.join(room)
    await person.say(room, "hello")
    first = await agent.client.sync(timeout=0, sync_filter=matrix.SYNC_FILTER)
    assert isinstance(first, nio.SyncResponse)
    [said] = [event for event in first.rooms.join[room].timeline.events if isinstance(event, nio.RoomMessageText)]
    assert isinstance(await person.client.room_typing(room, True), nio.RoomTypingResponse)
    assert isinstance(await person.client.update_receipt_marker(room, said.event_id), nio.UpdateReceiptMarkerResponse)
    unfiltered = await agent.client.sync(timeout=0, since=first.next_batch)
    assert isinstance(unfiltered, nio.SyncResponse) and unfiltered.rooms.join[room].ephemeral  # what the filter leaves out
    filtered = await agent.client.sync(timeout=0, sync_filter=matrix.SYNC_FILTER, since=first.next_batch)
    assert isinstance(filtered, nio.SyncResponse) and room not in filtered.rooms.join
