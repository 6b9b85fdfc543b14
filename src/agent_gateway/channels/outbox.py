"""The channel outbox: what a channel sends is written in the transaction that decides it.

An outbound Message of a User with a channel identity is also sent to that
User on a channel: its row is written by the Message's own transaction
(``messages.service`` calls :func:`add_messages`), so a committed Message is
always sent and a rolled-back one never is. Where (:func:`target`): the answer
to a Message written in a shared conversation (a Matrix group room), written
while that Message's Signal is handled, goes back to that conversation; every
other outbound Message goes to the User alone, in their private conversation
(a direct room), opened on the identity they last wrote from if they have none.
Others in a group room never read what the agent writes a User privately, a
Schedule's reminder or the answer to a question asked in a direct room just
before a mention in the group. When the User's most recent inbound Message
came through the Public server, or through an identity since unlinked from
them, no channel sends it. A User who has never written and has exactly one
identity gets a conversation opened on it (the row names no conversation: the
sender opens one). The channel's own words
(a pairing code, "only text is read") are rows too (:func:`add_notice`),
written with the read position that saw the message.

Where no channel is served (``Store.channels`` empty) an outbound Message's
writer pays one attribute read and no query. Rows are sent by the channel's
sender (``channels.sender``) with the shared outbox's claims and retries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, ids
from agent_gateway.channels import identities
from agent_gateway.store import engine
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import channels as queries
from agent_gateway.store.queries.messages import Message


def wake(channel: str) -> str:
    """The notification channel that wakes ``channel``'s sender once a delivery is written."""
    return f"channels.{channel}"


def target(route: queries.Route, served: frozenset[str]) -> tuple[str, str, str | None] | None:
    """Where an outbound Message of a User with ``route`` goes: ``(channel, identity,
    conversation or None to open one)``, or None when no channel sends it."""
    # Only conversations on identities the User still holds: one unlinked from them may be
    # another User's now (identities.unlink forgets them; one written by an attempt under way as
    # it did is still never used).
    private, shared = (
        held if held is not None and held.identity in route.identities else None
        for held in (route.private, route.shared)
    )
    # An answer to the Message written in a shared conversation, while its Signal is handled, goes
    # back there: everyone in it read the question. Nothing else ever goes there.
    if shared is not None and route.answering is not None and route.answering == shared.inbound_seq:
        return _in(shared, served)
    latest = route.last_inbound_seq
    # Everything else goes to the User alone, while their most recent inbound Message came by a
    # channel (a Public one since takes them off it): into their private conversation, or one
    # opened with the identity they last wrote from in a shared one.
    if private is not None and latest in (private.inbound_seq, None if shared is None else shared.inbound_seq):
        return _in(private, served)
    if shared is not None and latest == shared.inbound_seq:
        return (shared.channel, shared.identity, None) if shared.channel in served else None
    if latest is None and len(route.identities) == 1:  # never wrote: a conversation opened
        channel, _ = identities.parse(route.identities[0])
        if channel in served:
            return channel, route.identities[0], None
    return None


def _in(held: queries.Conversation, served: frozenset[str]) -> tuple[str, str, str | None] | None:
    return (held.channel, held.identity, held.conversation) if held.channel in served else None


async def add_messages(
    conn: AsyncConnection, sent: Sequence[Message], routes: Mapping[str, queries.Route] | None = None
) -> None:
    """Record the channel deliveries of outbound Messages ``sent`` by this transaction, given
    their Users' ``routes`` when the statement that wrote them read those too
    (``queries.append_many_routed``)."""
    served = engine.channels(conn)
    if not served or not sent:
        return
    if routes is None:
        routes = await queries.routes(conn, sorted({message.user_id for message in sent}))
    if not routes:
        return
    now = clock.now_iso()
    rows = []
    for message in sent:
        route = routes.get(message.user_id)
        found = None if route is None else target(route, served)
        if found is not None:
            channel, identity, conversation = found
            rows.append(_row(channel, identity, conversation, queries.MESSAGE, message.user_id, message.id, message.text, now))
    await _insert(conn, rows)


async def add_notice(conn: AsyncConnection, channel: str, identity: str, conversation: str | None, text: str) -> None:
    """Record a delivery of the channel's own ``text`` (an ``m.notice`` on Matrix) in ``conversation``;
    None: in one opened with ``identity`` when it is sent."""
    await _insert(conn, [_row(channel, identity, conversation, queries.NOTICE, None, None, text, clock.now_iso())])


def _row(
    channel: str, identity: str, conversation: str | None, kind: str,
    user_id: str | None, message_id: str | None, text: str, now: str,
) -> tuple[object, ...]:
    return (ids.new(), channel, identity, conversation, kind, user_id, message_id, text, now, now, now)


async def _insert(conn: AsyncConnection, rows: list[tuple[object, ...]]) -> None:
    for channel in sorted({str(row[1]) for row in rows}):
        await queries.insert(conn, [row for row in rows if row[1] == channel], wake=wake(channel))


async def newest(store: Store, *, limit: int, state: str | None = None) -> list[queries.Delivery]:
    """The newest ``limit`` deliveries, newest first; only those in ``state`` when given."""
    async with store.read() as conn:
        return await queries.newest(conn, limit=limit, state=state)
