"""Tokens and the password bearer scheme (spec: Token; Authentication 2, 6, 8).

A Token is ``agw_`` followed by 256 random bits from :mod:`secrets` in
base64url. Its text exists only in the response that issues it; the store
keeps its SHA-256, so a leaked database holds no usable credential.
"""

from __future__ import annotations

import functools
import hashlib
import re
import secrets

from starlette.requests import Request

from agent_gateway import clock
from agent_gateway.auth.schemes import Authenticated
from agent_gateway.store.batch import Lookups
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import tokens as queries
from agent_gateway.store.queries.users import User

PREFIX = "agw_"
RANDOM_BYTES = 32
_TOKEN = re.compile(re.escape(PREFIX) + r"[A-Za-z0-9_-]{43}")


def new() -> str:
    """A fresh Token's text."""
    return PREFIX + secrets.token_urlsafe(RANDOM_BYTES)


def digest(token: str) -> str:
    """What the store keeps of a Token: its SHA-256, in hex."""
    return hashlib.sha256(token.encode()).hexdigest()


async def live(store: Store, digests: list[str]) -> set[str]:
    """Which of ``digests`` are of Tokens that exist and have not expired now."""
    return await queries.live_digests(store, digests=digests, now=clock.now_iso())


def bearer(authorization: str | None) -> str | None:
    """The Token in ``Authorization: Bearer <Token>``, or None when the header holds no Token of ours."""
    if authorization is None:
        return None
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip(" ")
    # The scheme name is case-insensitive (RFC 7235); a Token of ours has one exact shape,
    # so a credential of another shape is not looked up at all.
    if scheme.lower() != "bearer" or not _TOKEN.fullmatch(credentials):
        return None
    return credentials


class PasswordScheme:
    """The password bearer scheme: a Token from ``POST /auth/tokens`` in the Authorization header.

    It answers None for a request without a bearer Token (so the next scheme
    is asked) and for an unknown or expired Token. The check is one indexed
    query: Token digest to User. On PostgreSQL the concurrent requests' checks go many to a
    statement (:class:`~agent_gateway.store.batch.Lookups`): a burst of 300 Users' Messages made
    300 statements of it, each a round trip and a statement's fixed cost in the server.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lookups: Lookups[tuple[str, str], User | None] | None = None
        if store.dialect == "postgresql":
            self._lookups = Lookups(functools.partial(queries.users_by_digests, store))

    async def authenticate(self, request: Request) -> Authenticated | None:
        token = bearer(request.headers.get("authorization"))
        if token is None:
            return None
        token_digest = digest(token)
        now = clock.now_iso()
        if self._lookups is None:
            user = await queries.user_by_digest(self._store, digest=token_digest, now=now)
        else:
            user = await self._lookups((token_digest, now))
        return None if user is None else Authenticated(user, self, token_digest)
