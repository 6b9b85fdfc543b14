"""Passwords and Tokens: login, rotation, revocation and the operator-side operations.

Spec: Token; Public server ``/auth`` routes; Route semantics 9-10;
Authentication 6-9. A derivation is never run while a database connection is
held for a login or a rotation: the digest is read, the password checked off
the event loop, and only then is anything written.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, errors, records
from agent_gateway.auth import passwords, tokens
from agent_gateway.config import ScryptCost
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import passwords as password_queries
from agent_gateway.store.queries import tokens as token_queries
from agent_gateway.store.queries.users import User
from agent_gateway.users import service as users_service

__all__ = [
    "IssuedToken",
    "change_password",
    "issue_token",
    "log_in",
    "revoke_token",
    "revoke_tokens",
    "set_password",
]


@dataclasses.dataclass(frozen=True)
class IssuedToken:
    """A Token as issued: the only time its text exists."""

    token: str
    expires_at: str
    user: User

    def to_json(self) -> records.Token:
        return {"token": self.token, "expiresAt": self.expires_at, "user": self.user.to_json()}


async def _issue(conn: AsyncConnection, user: User, ttl_ms: int) -> IssuedToken:
    issued_at = clock.now()
    token = tokens.new()
    expires_at = clock.format_instant(issued_at + timedelta(milliseconds=ttl_ms))
    await token_queries.insert(
        conn,
        digest=tokens.digest(token),
        user_id=user.id,
        created_at=clock.format_instant(issued_at),
        expires_at=expires_at,
    )
    return IssuedToken(token, expires_at, user)


async def log_in(store: Store, user_id: str, password: str, *, cost: ScryptCost, ttl_ms: int) -> IssuedToken:
    """``POST /auth/tokens``: a new Token for ``user_id`` if ``password`` is that User's.

    An id nobody holds, a User with no password and a wrong password all
    spend one derivation and raise the same ``errors.AuthenticationFailed``
    (Authentication 6, Route semantics 10). The Token expires ``ttl_ms``
    after now; nothing renews it.
    """
    async with store.read() as conn:
        found = await password_queries.user_and_digest(conn, id=user_id)
    if not await passwords.verify(password, found[1] if found else None, cost):
        raise errors.AuthenticationFailed()
    assert found is not None
    async with store.transaction() as conn:
        return await _issue(conn, found[0], ttl_ms)


async def change_password(store: Store, user_id: str, current: str, new: str, *, cost: ScryptCost) -> None:
    """``PUT /auth/password``: replace the password after proving the current one.

    Revokes nothing (Route semantics 9). A wrong ``current``, or a User with
    no password, raises ``errors.AuthenticationFailed``; so does a rotation that
    another one overtook after ``current`` was checked, since what was proven
    is no longer the stored password.
    """
    async with store.read() as conn:
        found = await password_queries.user_and_digest(conn, id=user_id)
    previous = found[1] if found else None
    if not await passwords.verify(current, previous, cost):
        raise errors.AuthenticationFailed()
    assert previous is not None
    digest = await passwords.derive(new, cost)
    async with store.transaction() as conn:
        if not await password_queries.replace_digest(conn, id=user_id, digest=digest, previous=previous):
            raise errors.AuthenticationFailed()


async def set_password(conn: AsyncConnection, user_id: str, password: str, *, cost: ScryptCost) -> None:
    """Operator-side: set a User's password without proving the current one (Authentication 9).

    Also gives a first password. No length bound; revokes no Token; emits no
    Signal. Raises ``users.service.UserNotFound``, or ``errors.InvalidInput`` for a
    password that is not valid Unicode text (a lone surrogate).
    """
    await users_service.get(conn, user_id)
    digest = await passwords.derive(password, cost)
    await password_queries.set_digest(conn, id=user_id, digest=digest)


async def issue_token(conn: AsyncConnection, user_id: str, *, ttl_ms: int) -> IssuedToken:
    """Operator-side: an ordinary Token for a User, password or not; raises ``users.service.UserNotFound``."""
    return await _issue(conn, await users_service.get(conn, user_id), ttl_ms)


async def revoke_tokens(conn: AsyncConnection, user_id: str) -> None:
    """Every Token of the User stops working (``DELETE /auth/tokens``, and operator-side).

    Idempotent; an id nobody holds has no Tokens, so nothing happens.
    """
    await token_queries.delete_for_user(conn, user_id=user_id)


async def revoke_token(conn: AsyncConnection, user_id: str, token_digest: str) -> None:
    """``DELETE /auth/tokens/current``: the one Token with ``token_digest`` stops working. Idempotent."""
    await token_queries.delete_one(conn, digest=token_digest, user_id=user_id)

