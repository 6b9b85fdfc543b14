"""Channel identities: ``<channel>:<address>`` (``matrix:@alice:example.org``), each linked to one User.

A User may have any number of identities; an identity belongs to at most one
User. They live in their own table: the spec's User record is unchanged and
no spec route shows them. Linking is the operator's (``agent-gateway users
link``, or ``pairing approve``), or the ``open`` policy's on a first message.
"""

from __future__ import annotations

import logging
import re

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, config, errors
from agent_gateway.store.queries import channels as queries
from agent_gateway.store.queries import messages as message_queries
from agent_gateway.store.queries import users as user_queries
from agent_gateway.store.queries.channels import Identity
from agent_gateway.users.service import UserNotFound

__all__ = [
    "CHANNELS", "UNLINKED", "Identity", "IdentityLinked", "InvalidIdentity", "NotLinked",
    "link", "of_user", "parse", "unlink",
]

logger = logging.getLogger(__name__)

# What an address is on each network (Matrix: a user ID; Nostr: a public key, 64 hex digits).
_ADDRESSES: dict[str, re.Pattern[str]] = {"matrix": config.MATRIX_USER_ID, "nostr": re.compile("[0-9a-f]{64}")}
CHANNELS = tuple(_ADDRESSES)
# The error of a User's delivery ended because its identity was unlinked from them (unlink).
UNLINKED = "not sent: the identity was unlinked from the User"


class InvalidIdentity(errors.InvalidInput):
    """An identity is <channel>:<address>, such as matrix:@alice:example.org."""


class IdentityLinked(errors.GatewayError):
    """The identity is already linked to a User."""


class NotLinked(errors.NotFound):
    """The identity is not linked to that User."""


def parse(identity: str) -> tuple[str, str]:
    """``identity`` as ``(channel, address)``; raises :class:`InvalidIdentity` naming what is wrong."""
    channel, colon, address = identity.partition(":")
    if not colon or channel not in _ADDRESSES:
        raise InvalidIdentity(
            f"{identity!r} is not an identity: write <channel>:<address> with a channel of {', '.join(CHANNELS)} "
            "(such as matrix:@alice:example.org)"
        )
    if channel == "nostr":
        address = _nostr_hex(identity, address)
    if not _ADDRESSES[channel].fullmatch(address):
        raise InvalidIdentity(f"{identity!r} is not an identity: {address!r} is not a {channel} address")
    return channel, address


def _nostr_hex(identity: str, address: str) -> str:
    """A Nostr public key as stored: lowercase hex, from hex or its bech32 form (``npub1...``)."""
    if not address.startswith("npub1"):
        return address.lower()
    try:
        # Imported here: nostr-sdk is an optional extra, and only npub needs it.
        import nostr_sdk
    except ImportError:
        raise InvalidIdentity(f"{identity!r}: an npub needs the nostr extra (pip install 'agent-gateway[nostr]'); "
                              "or write the key in hex") from None
    try:
        return nostr_sdk.PublicKey.parse(address).to_hex()
    except nostr_sdk.NostrSdkError:
        raise InvalidIdentity(f"{identity!r} is not an identity: {address!r} is not an npub") from None


def name(channel: str, address: str) -> str:
    """The identity of ``address`` on ``channel``."""
    return f"{channel}:{address}"


async def link(conn: AsyncConnection, user_id: str, identity: str) -> Identity:
    """Link ``identity`` to the User ``user_id``, in the caller's transaction.

    Raises :class:`InvalidIdentity`, :class:`UserNotFound`, or :class:`IdentityLinked`
    (to this User or another: nothing is changed).
    """
    channel, address = parse(identity)
    identity = name(channel, address)
    if await user_queries.get(conn, id=user_id) is None:
        raise UserNotFound(f"no User has the id {user_id}")
    try:
        return await queries.link(conn, identity=identity, channel=channel, user_id=user_id, created_at=clock.now_iso())
    except queries.IdentityTaken:
        holder = await queries.identity(conn, identity)
        whose = "this User" if holder is not None and holder.user_id == user_id else "another User"
        raise IdentityLinked(f"{identity} is already linked to {whose}") from None


async def unlink(conn: AsyncConnection, user_id: str, identity: str) -> None:
    """Remove the link of ``identity`` to ``user_id``, and with it, in the caller's transaction,
    everything of that User on its way to the identity: whoever holds it next (another User,
    after a pairing) must never read this User's answers.

    The User's deliveries to it not yet sent end dead with the error :data:`UNLINKED` (closed
    rows: never sent, listed by ``channels deliveries --state dead`` with why, removed by
    retention like any; deleting them would hide from the operator that answers were never
    sent), and their conversation on it is forgotten, so their next answer goes nowhere on a
    channel until they write from an identity they hold. Raises :class:`InvalidIdentity`,
    :class:`UserNotFound` or :class:`NotLinked` (nothing is changed).
    """
    identity = name(*parse(identity))
    if await user_queries.get(conn, id=user_id) is None:
        raise UserNotFound(f"no User has the id {user_id}")
    # The User's log locked as each writer of their Messages locks it (messages.service): one
    # writing an answer meanwhile has either committed its delivery, which is ended below, or
    # reads the User's route once this has committed.
    await message_queries.lock_logs(conn, user_ids=[user_id])
    if not await queries.unlink(conn, identity=identity, user_id=user_id):
        raise NotLinked(f"{identity} is not linked to User {user_id}")
    ended = await queries.end_deliveries(conn, user_id=user_id, identity=identity, error=UNLINKED, now=clock.now_iso())
    await queries.forget_conversation(conn, user_id=user_id, identity=identity)
    logger.info(
        "unlinked %s from User %s%s", identity, user_id, f"; {ended} deliveries to it not sent" if ended else "",
        extra={"action": "identity_unlinked"},
    )


async def of_user(conn: AsyncConnection, user_id: str) -> list[Identity]:
    """The identities of ``user_id``, oldest link first; raises :class:`UserNotFound`."""
    if await user_queries.get(conn, id=user_id) is None:
        raise UserNotFound(f"no User has the id {user_id}")
    return await queries.identities_of(conn, user_id)


async def user_of(conn: AsyncConnection, identity: str) -> str | None:
    """The User ``identity`` is linked to, if any."""
    found = await queries.identity(conn, identity)
    return None if found is None else found.user_id
