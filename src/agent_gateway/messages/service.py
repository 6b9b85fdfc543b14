"""Message logs: the programmatic API (spec: Message, Route semantics 7-8, Errors 2).

Each User has one log numbered from 1, inbound (User to agent) and outbound
(agent to User) Messages counted in one sequence. The direction is decided by
the caller (the server that received the request), never by a field. Every
function takes a connection inside the caller's transaction.

Numbering: ``seq`` is computed inside the INSERT and the (User, seq) primary
key refuses a duplicate. To keep that refusal rare, the writers of one User are
serialised first (``store.messages.lock_log``): on PostgreSQL by locking the
User's row for the rest of the transaction, on SQLite by the write transaction
itself (``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, errors
from agent_gateway.signals import service as signals
from agent_gateway.store import messages as queries
from agent_gateway.store.engine import Store
from agent_gateway.store.messages import LostRace, Message
from agent_gateway.store.window import Window
from agent_gateway.users.service import UserNotFound

__all__ = ["InvalidText", "LostRace", "Message", "RECEIVED", "read", "receive", "send"]

INBOUND = "inbound"
OUTBOUND = "outbound"
# The kind of the Signal that wakes the agent for an inbound Message.
RECEIVED = "message.received"


async def receive(conn: AsyncConnection, user_id: str, text: str) -> Message:
    """Record an inbound Message from the User and the Signal that wakes the agent for it.

    Both are written in the caller's transaction (Route semantics 7), so a
    stored Message always has its Signal: kind ``message.received``, payload
    the Message record ``{id, userId, direction, seq, text, createdAt}``.

    Raises :class:`InvalidText`, :class:`UserNotFound`, or :class:`LostRace`
    (503: nothing may be committed; resending is correct).
    """
    message = await _append(conn, user_id, INBOUND, text)
    await signals.emit(conn, RECEIVED, message.to_json())
    return message


async def send(conn: AsyncConnection, user_id: str, text: str) -> Message:
    """Record an outbound Message from the agent to the User; emits no Signal.

    Raises :class:`InvalidText`, :class:`UserNotFound` (404: nobody has that
    id, nothing stored), or :class:`LostRace` (503).
    """
    return await _append(conn, user_id, OUTBOUND, text)


async def read(store: Store, user_id: str, window: Window) -> list[Message]:
    """One cursor window of a User's log, ascending by ``seq``, both directions interleaved.

    A User nobody holds has an empty log (the read routes list no 404).
    """
    return await queries.window(store, user_id=user_id, window=window)


class InvalidText(errors.InvalidInput):
    """text must be a non-empty string without NUL characters."""


def _check_text(text: object) -> None:
    """A Message text: any non-empty string, except that NUL characters are refused.

    PostgreSQL's text type cannot hold NUL, so refusing it everywhere keeps
    both backends answering the same (400, never a 500).
    """
    if not isinstance(text, str) or not text:
        raise InvalidText("text must be a non-empty string")
    if "\x00" in text:
        raise InvalidText("text must not contain NUL characters")


async def _append(conn: AsyncConnection, user_id: str, direction: str, text: str) -> Message:
    _check_text(text)
    await queries.lock_log(conn, user_id=user_id)
    message = await queries.append(
        conn,
        id=str(uuid.uuid4()),
        user_id=user_id,
        direction=direction,
        text=text,
        created_at=clock.now_iso(),
    )
    if message is None:
        raise UserNotFound()
    return message
