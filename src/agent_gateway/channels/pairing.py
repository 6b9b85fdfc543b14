"""Pairing: how a stranger on a channel asks to be admitted, and how the operator answers.

Under the ``pairing`` policy a message from an identity linked to no User gets
one reply with an 8-character code and what to do with it; nothing is stored
as a Message and no User is admitted. While the code is pending that identity
gets no new one. A code expires after :data:`EXPIRES_AFTER` (then a new
message gets a new code), and at most :data:`MAX_PENDING` are pending per
channel, so a flood of strangers cannot fill the table: past that, a stranger
gets no reply. The operator lists, approves (admitting a new User or linking
to an existing one) or denies requests (``agent-gateway pairing``). Requests
and their outcome are logged, never a message's text.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, errors
from agent_gateway.channels import identities
from agent_gateway.ops import metrics
from agent_gateway.store.queries import channels as queries
from agent_gateway.store.queries.channels import Pairing
from agent_gateway.users import service as users

logger = logging.getLogger(__name__)

CODE_LENGTH = 8
# No 0/O or 1/I/L: a person reads the code out of a chat and the operator types it.
CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
EXPIRES_AFTER = timedelta(hours=1)
MAX_PENDING = 20


def reply(code: str) -> str:
    """The one reply that carries a code."""
    return (
        f"Hello! To talk to this agent, ask its operator to approve your pairing code {code} "
        "(it expires in one hour)."
    )


class UnknownCode(errors.NotFound):
    """No pending pairing request has this code."""


async def request(conn: AsyncConnection, channel: str, identity: str) -> Pairing | None:
    """A new code for ``identity`` (linked to no User), in the caller's transaction; None when
    it gets none: its code is still pending, or the channel has :data:`MAX_PENDING` pending."""
    now = clock.now()
    now_text = clock.format_instant(now)
    held = await queries.pairing_of(conn, identity)
    if held is not None and held.expires_at > now_text:
        _logged(channel, identity, "pending", held.code)
        return None
    await queries.remove_expired(conn, channel=channel, now=now_text)
    if await queries.count_pending(conn, channel=channel, now=now_text) >= MAX_PENDING:
        _logged(channel, identity, "refused", None)
        return None
    new = Pairing(_code(), channel, identity, now_text, clock.format_instant(now + EXPIRES_AFTER))
    await queries.add_pairing(conn, new)
    _logged(channel, identity, "issued", new.code)
    return new


def _code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


def _logged(channel: str, identity: str, outcome: str, code: str | None) -> None:
    metrics.channel_pairing_requests.labels(channel, outcome).inc()
    logger.info(
        "pairing request from %s: %s%s", identity,
        {"issued": "code issued", "pending": "its code is still pending, no new one",
         "refused": f"not answered, {MAX_PENDING} requests are pending on {channel}"}[outcome],
        f" ({code})" if code and outcome == "issued" else "",
        extra={"action": "pairing_request", "channel": channel, "status": outcome},
    )


async def pending(conn: AsyncConnection) -> list[Pairing]:
    """The requests not expired, oldest first."""
    return await queries.pending(conn, now=clock.now_iso())


@dataclasses.dataclass(frozen=True)
class Approved:
    user_id: str
    identity: str
    admitted: bool  # a new User, rather than a link to an existing one


async def approve(conn: AsyncConnection, code: str, user_id: str | None = None) -> Approved:
    """Approve the request ``code``: link its identity to ``user_id``, or to a new User.

    Raises :class:`UnknownCode` (none pending, or expired), ``UserNotFound`` or
    ``IdentityLinked``; any of them changes nothing (the caller's transaction rolls back).
    """
    found = await _pending(conn, code)
    admitted = user_id is None
    if user_id is None:
        user_id = (await users.admit(conn)).id
    await identities.link(conn, user_id, found.identity)
    await queries.remove_pairing(conn, found.code)
    logger.info(
        "pairing %s of %s approved: %s User %s", found.code, found.identity,
        "admitted as" if admitted else "linked to", user_id,
        extra={"action": "pairing_approved", "channel": found.channel},
    )
    return Approved(user_id, found.identity, admitted)


async def deny(conn: AsyncConnection, code: str) -> Pairing:
    """Remove the request ``code`` (its identity may ask again later); raises :class:`UnknownCode`."""
    found = await _pending(conn, code)
    await queries.remove_pairing(conn, found.code)
    logger.info(
        "pairing %s of %s denied", found.code, found.identity,
        extra={"action": "pairing_denied", "channel": found.channel},
    )
    return found


async def _pending(conn: AsyncConnection, code: str) -> Pairing:
    normal = code.strip().upper()
    found = await queries.pairing(conn, normal) if len(normal) == CODE_LENGTH else None
    if found is None:
        raise UnknownCode(f"no pending pairing request has the code {code!r}")
    if found.expires_at <= clock.now_iso():
        raise UnknownCode(f"the pairing code {normal} expired at {found.expires_at}; the person gets a new one by writing again")
    return found
