"""Message logs: the programmatic API (spec: Message, Route semantics 7-8, Errors 2).

Each User has one log numbered from 1, inbound (User to agent) and outbound
(agent to User) Messages counted in one sequence. The direction is decided by
the caller (the server that received the request), never by a field. Every
function takes a connection inside the caller's transaction; a :class:`Writer`
(the routes') owns its transactions.

Numbering: ``seq`` is computed inside the INSERT and the (User, seq) primary
key refuses a duplicate. To keep that refusal rare, the writers of one User are
serialised first (``store.queries.messages.lock_logs``): on PostgreSQL by locking the
User's row for the rest of the transaction, on SQLite by the write transaction
itself (``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, errors, ids, jsontext
from agent_gateway.channels import outbox as channel_outbox
from agent_gateway.ops import metrics
from agent_gateway.signals import service as signals
from agent_gateway.store import engine, notifications
from agent_gateway.store.batch import Batcher
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import channels as channel_queries
from agent_gateway.store.queries import messages as queries
from agent_gateway.store.queries.messages import LostRace, Message
from agent_gateway.store.window import Window
from agent_gateway.users.service import UserNotFound
from agent_gateway.webhooks import outbox

__all__ = ["Draft", "InvalidText", "LostRace", "Message", "RECEIVED", "Writer", "append_many", "channel", "read", "receive", "send"]

INBOUND = "inbound"
OUTBOUND = "outbound"
# The kind of the Signal that wakes the agent for an inbound Message.
RECEIVED = "message.received"


def channel(user_id: str) -> str:
    """The notification channel of one User's log: woken after a commit that appends to it
    (its streams then read the new rows; a notification carries no Message)."""
    return f"messages.{user_id}"


async def receive(conn: AsyncConnection, user_id: str, text: str) -> Message:
    """Record an inbound Message from the User and the Signal that wakes the agent for it.

    Both are written in the caller's transaction (Route semantics 7), so a
    stored Message always has its Signal: kind ``message.received``, payload
    the Message record ``{id, userId, direction, seq, text, createdAt}``.

    Raises :class:`InvalidText`, :class:`UserNotFound`, or :class:`LostRace`
    (503: nothing may be committed; resending is correct).
    """
    return await _append_one(conn, Draft(user_id, INBOUND, text))


async def send(conn: AsyncConnection, user_id: str, text: str) -> Message:
    """Record an outbound Message from the agent to the User; emits no Signal.

    Raises :class:`InvalidText`, :class:`UserNotFound` (404: nobody has that
    id, nothing stored), or :class:`LostRace` (503).
    """
    return await _append_one(conn, Draft(user_id, OUTBOUND, text))


@dataclasses.dataclass(frozen=True)
class Draft:
    """A Message to record: whose log, which direction, what text."""

    user_id: str
    direction: str
    text: str


async def append_many(conn: AsyncConnection, drafts: Sequence[Draft]) -> list[Message | errors.GatewayError]:
    """Record ``drafts`` in order in the caller's transaction, inbound ones with their Signal.

    A draft refused without writing anything (:class:`InvalidText`,
    :class:`UserNotFound`) answers its error in its place and the others go
    on; a lost race (:class:`LostRace`) is raised, and the transaction must
    roll back.
    """
    refused: list[errors.GatewayError | None] = [_refusal(draft.text) for draft in drafts]
    await queries.lock_logs(conn, user_ids=sorted({draft.user_id for draft in drafts}))
    rows = _rows(drafts, refused)
    # Where a channel is served, PostgreSQL reads the outbound Messages' routes in the statement
    # that writes them (SQLite's statements cost no round trip: channels.outbox reads them after).
    routes = None
    if engine.channels(conn) and conn.dialect.name == "postgresql" and any(row[2] == OUTBOUND for row in rows):
        written, routes = await channel_queries.append_many_routed(conn, rows, channel)
    else:
        written = await queries.append_many(conn, rows, channel)
    recorded = _placed(refused, written)
    received = [m.to_json() for m in recorded if isinstance(m, Message) and m.direction == INBOUND]
    if received:
        await signals.emit_many(conn, RECEIVED, received, origin=signals.MESSAGE, late=True)
    for direction, event in ((INBOUND, outbox.MESSAGE_INBOUND), (OUTBOUND, outbox.MESSAGE_OUTBOUND)):
        await outbox.add(
            conn, event, ((m.created_at, m.to_json()) for m in recorded if isinstance(m, Message) and m.direction == direction)
        )
    # An outbound Message also goes to its User on a chat channel, sent from the channel outbox
    # (nothing is even looked at where no channel is served).
    if engine.channels(conn):
        await channel_outbox.add_messages(
            conn, [m for m in recorded if isinstance(m, Message) and m.direction == OUTBOUND], routes
        )
    return recorded


def _rows(drafts: Sequence[Draft], refused: Sequence[errors.GatewayError | None]) -> list[tuple[str, str, str, str, str]]:
    """The rows to write (``store.queries.messages.append_many``) of the drafts not refused."""
    now = clock.now_iso()
    return [
        (ids.new(), draft.user_id, draft.direction, draft.text, now)
        for draft, refusal in zip(drafts, refused, strict=True)
        if refusal is None
    ]


def _received(rows: Sequence[tuple[str, str, str, str, str]]) -> queries.Received:
    """The pending Signals of inbound ``rows`` for the statement that writes them
    (``store.queries.messages.append_alone``): each payload is the Message's record as
    :func:`append_many` emits it, its text cut around the ``seq`` the statement will give it."""
    emitted_at = clock.now_iso()
    made = []
    for id, user_id, direction, text, created_at in rows:
        record = jsontext.dumps(Message(id, user_id, direction, 0, text, created_at).to_json()).decode()
        # "seq" follows the id, the User's id and the direction, none of which can hold it.
        before, _, after = record.partition('"seq":0')
        made.append((ids.new(), id, before + '"seq":', after, emitted_at))
    return queries.Received(RECEIVED, signals.MESSAGE, made)


def _placed(refused: Sequence[errors.GatewayError | None], written: Sequence[Message | None]) -> list[Message | errors.GatewayError]:
    """Each draft's outcome in its place: its refusal, its Message, or UserNotFound (no row written)."""
    appended = iter(written)
    recorded: list[Message | errors.GatewayError] = []
    for refusal in refused:
        if refusal is not None:
            recorded.append(refusal)
            continue
        message = next(appended)
        recorded.append(UserNotFound() if message is None else message)
    return recorded


# A statement written alone that lost the race for a number is run again: each loss means another
# writer of the same User's log committed meanwhile, so a handful is more than contention makes.
ALONE_ATTEMPTS = 5


class Writer:
    """Records the Messages of concurrent requests, many to a transaction (see ``store.batch``)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._batcher: Batcher[Draft, Message] = Batcher(store, append_many)
        # One each way: a batch of one direction is one statement written alone.
        self._alone = {
            direction: Batcher(store, self._append_alone, alone=True) for direction in (INBOUND, OUTBOUND)
        }

    async def receive(self, user_id: str, text: str) -> Message:
        """:func:`receive` in a transaction of its own, shared with whoever writes at the same time."""
        return await self._append(Draft(user_id, INBOUND, text))

    async def send(self, user_id: str, text: str) -> Message:
        """:func:`send` in a transaction of its own, shared with whoever writes at the same time."""
        return await self._append(Draft(user_id, OUTBOUND, text))

    def _alone_for(self, direction: str) -> bool:
        """Whether Messages of ``direction`` are written by one statement that commits alone: on
        PostgreSQL, where nothing else is written with them (no webhook endpoint of their event;
        for outbound ones, no chat channel). BEGIN, the Users' lock and COMMIT, and for an inbound
        Message the statement that writes its Signal, are round trips less on each."""
        store = self._store
        if store.dialect != "postgresql" or (direction == OUTBOUND and store.channels):
            return False
        event = outbox.MESSAGE_INBOUND if direction == INBOUND else outbox.MESSAGE_OUTBOUND
        return not store.webhook_urls.get(event)

    async def _append_alone(self, conn: AsyncConnection, drafts: Sequence[Draft]) -> list[Message | errors.GatewayError]:
        """:func:`append_many` of one direction's ``drafts`` as one statement on a connection of
        ``Store.alone`` (see :meth:`_alone_for`), whatever their Users.

        The statement takes its Users' locks before it writes (``store.queries.messages.append_alone``),
        in the order of their ids, as every writer of several logs does (:func:`lock_logs`): two
        writers never each wait on a lock the other holds. A burst's inbound Messages of 300 Users,
        written in a transaction, took four round trips more per batch (BEGIN, the lock, the
        Signals, COMMIT)."""
        refused: list[errors.GatewayError | None] = [_refusal(draft.text) for draft in drafts]
        rows = _rows(drafts, refused)
        users = sorted({row[1] for row in rows})
        payloads = [notifications.pg_payload(self._store.origin, channel(user_id)) for user_id in users]
        received = None
        if drafts[0].direction == INBOUND:  # their Signals too, and the Signal Worker's wake-up
            received = _received(rows)
            payloads.append(notifications.pg_payload(self._store.origin, signals.CHANNEL))
        for attempt in range(1, ALONE_ATTEMPTS + 1):
            try:
                written = await queries.append_alone(conn, rows, payloads, received)
                break
            except LostRace:  # nothing written: run again, with a snapshot that sees the other writer's
                if attempt == ALONE_ATTEMPTS:
                    raise
        # Committed: this process's streams (and worker) are woken here, the others' by the statement's NOTIFY.
        for user_id in sorted({message.user_id for message in written if message is not None}):
            self._store.publish(channel(user_id))
        if received is not None and any(message is not None for message in written):
            self._store.publish(signals.CHANNEL)
        return _placed(refused, written)

    async def _append(self, draft: Draft) -> Message:
        batcher = self._alone[draft.direction] if self._alone_for(draft.direction) else self._batcher
        try:
            message = await batcher.submit(draft)
        except LostRace:
            metrics.message_write_conflicts.inc()
            raise
        metrics.messages.labels(draft.direction).inc()
        return message


async def read(store: Store, user_id: str, window: Window) -> list[Message]:
    """One cursor window of a User's log, ascending by ``seq``, both directions interleaved.

    A User nobody holds has an empty log (the read routes list no 404).
    """
    return await queries.window(store, user_id=user_id, window=window)


async def last_row(store: Store) -> int:
    """Where all logs together end on SQLite (the table's rowid, 0 when empty): it only grows."""
    return await queries.last_rowid(store)


async def writers_since(store: Store, row: int) -> list[str]:
    """The Users with a Message written after :func:`last_row` was ``row`` (on SQLite)."""
    return await queries.writers_since(store, rowid=row)


class InvalidText(errors.InvalidInput):
    """text must be a non-empty string without NUL characters."""


def _refusal(text: object) -> InvalidText | None:
    """Why a Message text is refused: it must be a non-empty string, and NUL characters are refused.

    PostgreSQL's text type cannot hold NUL, so refusing it everywhere keeps
    both backends answering the same (400, never a 500).
    """
    if not isinstance(text, str) or not text:
        return InvalidText("text must be a non-empty string")
    if "\x00" in text:
        return InvalidText("text must not contain NUL characters")
    return None


async def _append_one(conn: AsyncConnection, draft: Draft) -> Message:
    [recorded] = await append_many(conn, [draft])
    if isinstance(recorded, Exception):
        raise recorded
    return recorded
