"""The channel outbox: what a channel sends is written in the transaction that decides it.

An outbound Message of a User with a channel identity is also sent to that
User on the channel of their most recent inbound Message: its row is written
by the Message's own transaction (``messages.service`` calls :func:`add_messages`),
so a committed Message is always sent and a rolled-back one never is. When that
most recent inbound Message came through the Public server, or through an
identity since unlinked from the User, no channel sends it. A User who has
never written and has exactly one identity gets a conversation opened on it
(the row names no conversation: the sender opens one). The channel's own words
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
    held = route.conversation
    # Only a conversation on an identity the User still holds: one unlinked from them may be
    # another User's now (identities.unlink forgets it; one written by an attempt under way as
    # it did is still never used).
    if held is not None and held.identity in route.identities:
        # Still the most recent inbound Message's conversation (or, for one the gateway opened,
        # still none written since)? A Public inbound Message since then takes the User off it.
        if held.inbound_seq == route.last_inbound_seq and held.channel in served:
            return held.channel, held.identity, held.conversation
        return None
    if route.last_inbound_seq is None and len(route.identities) == 1:
        channel, _ = identities.parse(route.identities[0])
        if channel in served:
            return channel, route.identities[0], None
    return None


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


async def add_notice(conn: AsyncConnection, channel: str, identity: str, conversation: str, text: str) -> None:
    """Record a delivery of the channel's own ``text`` (an ``m.notice`` on Matrix) in ``conversation``."""
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
