"""Taking what people write on a channel: policies, inbound Messages and the read position.

A channel module hands over what one read brought (Matrix: one sync's events)
and where that read ends (the next sync token): :func:`record` stores all of
it in one transaction, with the position, so a restart takes every message
received while the gateway was down exactly once, in order, and never one
twice. A text from a linked identity becomes an inbound Message of its User
exactly as the Public ``POST /messages`` makes one (``messages.service.receive``:
the Message and its ``message.received`` Signal, the per-User numbering); a
lost numbering race rolls the whole read back and it is stored again, never
dropped. What a text from an identity linked to no User does is the channel's
policy: :data:`PAIRING` (one reply with a code, see ``channels.pairing``),
:data:`ALLOWLIST` (nothing), :data:`OPEN` (a new User is admitted).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, config
from agent_gateway.channels import identities, outbox, pairing
from agent_gateway.messages import service as messages
from agent_gateway.ops import metrics
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import channels as queries
from agent_gateway.users import service as users

logger = logging.getLogger(__name__)

PAIRING, ALLOWLIST, OPEN = config.CHANNEL_POLICIES
# What a message is, as far as the machinery cares.
TEXT, UNREADABLE = "text", "unreadable"
ONLY_TEXT = "Sorry, I can only read text messages: please write what you want to say."
# A lost numbering race is retried at once, then after growing waits up to this.
MAX_RACE_WAIT_S = 1.0

STORED, PAIRING_REPLY, IGNORED, REPLIED = "stored", "pairing", "ignored", "replied"


@dataclasses.dataclass(frozen=True)
class Received:
    """One message a person wrote: who (their address on the channel), where (the conversation
    to answer in), what kind and, for text, the text (never logged); for what cannot be read,
    the reply to send instead (default :data:`ONLY_TEXT`), and whether that reply is said only
    ``once`` in the conversation, across restarts and processes. A ``shared`` conversation is
    read by others than the person (a Matrix group room): it gets only the answers to what
    they wrote there (``channels.outbox``)."""

    address: str
    conversation: str
    kind: str
    text: str = ""
    once: bool = False
    shared: bool = False


async def take(conn: AsyncConnection, channel: str, policy: str, received: Received) -> str:
    """Apply ``policy`` to one message, in the caller's transaction; the outcome's name."""
    identity = identities.name(channel, received.address)
    user_id = await identities.user_of(conn, identity)
    if user_id is None:
        if policy == OPEN:
            user_id = (await users.admit(conn)).id
            await identities.link(conn, user_id, identity)
            logger.info("admitted %s as User %s (open policy)", identity, user_id, extra={"action": "channel_admit"})
        elif policy == PAIRING and received.kind == TEXT:
            code = await pairing.request(conn, channel, identity)
            if code is None:
                return IGNORED
            # A code is the stranger's own business: written in a group room, it goes to a direct
            # room opened with them (channels.sender), not to everyone there.
            where = None if received.shared else received.conversation
            await outbox.add_notice(conn, channel, identity, where, pairing.reply(code.code))
            return PAIRING_REPLY
        else:
            return IGNORED
    if received.kind != TEXT:
        reply = received.text or ONLY_TEXT
        if received.once and await queries.notice_recorded(
            conn, channel=channel, conversation=received.conversation, text=reply
        ):
            return IGNORED
        await outbox.add_notice(conn, channel, identity, received.conversation, reply)
        return REPLIED
    message = await messages.receive(conn, user_id, received.text)
    await queries.set_conversation(conn, queries.Conversation(
        user_id, channel, identity, received.conversation, message.seq, message.created_at
    ), shared=received.shared)
    return STORED


async def record(
    store: Store, channel: str, policy: str, read: Sequence[Received], position: str | Callable[[list[str]], str],
    *, shared: Sequence[str] = (),
) -> list[str]:
    """Store what one read brought and the position it ends at, in one transaction; the outcomes.

    ``position`` may depend on the outcomes (Nostr remembers what each message did): then it
    is a function of them, called in the transaction (again if it is done again). ``shared``:
    conversations this read found read by others than one person (a direct room someone was
    invited to): they stop being any User's private conversation, before what was read is taken.
    A lost numbering race (another writer of one of these Users' logs) rolls it all back and
    it is done again; any other failure rolls it back and is raised, the position unchanged.
    """
    attempt = 0
    while True:
        try:
            async with store.transaction() as conn:
                if shared:
                    await queries.forget_private(conn, channel=channel, conversations=shared)
                outcomes = [await take(conn, channel, policy, received) for received in read]
                ends = position if isinstance(position, str) else position(outcomes)
                await queries.set_read_position(conn, channel=channel, position=ends, now=clock.now_iso())
        except messages.LostRace:
            metrics.message_write_conflicts.inc()
            await asyncio.sleep(min(0.01 * 2**attempt, MAX_RACE_WAIT_S) if attempt else 0)
            attempt += 1
            continue
        for outcome in outcomes:
            metrics.channel_messages.labels(channel, "in", outcome).inc()
            if outcome == STORED:
                metrics.messages.labels(messages.INBOUND).inc()
        return outcomes


async def read_position(store: Store, channel: str) -> str | None:
    """Where ``channel`` has read up to; None for a deployment that never connected it."""
    async with store.read() as conn:
        return await queries.read_position(conn, channel)


async def start_position(store: Store, channel: str, position: str) -> None:
    """Record where a channel's first read starts: what came before it is never taken."""
    async with store.transaction() as conn:
        await queries.set_read_position(conn, channel=channel, position=position, now=clock.now_iso())
