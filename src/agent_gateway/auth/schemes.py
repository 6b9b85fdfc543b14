"""Authentication schemes of the Public server (spec: Authentication 2, 6).

A deployment registers any number of schemes, in order, on
``Gateway.auth_schemes``. A request is accepted if any scheme authenticates
it, asked in registration order; a scheme answers ``None`` for a request that
is not its own (the password scheme, for one without a bearer header) or that
it refuses. With no scheme registered every protected route answers 401.
Every failure is the same 401 with the same body.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Protocol

from starlette.requests import Request

from agent_gateway import errors
from agent_gateway.store.queries.users import User

@dataclasses.dataclass(frozen=True)
class Authenticated:
    """Who a request acts as, and how it proved it."""

    user: User
    scheme: Scheme
    # The digest of the presented Token when the password scheme authenticated the request.
    token_digest: str | None = None
    # Whether the caller may still act as ``user``, for a long request (the Message stream) that
    # cannot present its proof again (a NIP-98 event is spent by its first use). None: the
    # request is authenticated again instead.
    still_valid: Callable[[], Awaitable[bool]] | None = None


class Scheme(Protocol):
    async def authenticate(self, request: Request) -> Authenticated | None:
        """The request's User, or None when this scheme does not authenticate it."""
        ...


async def authenticated(request: Request) -> Authenticated:
    """FastAPI dependency of every protected Public route."""
    for scheme in request.app.state.auth_schemes:
        result = await scheme.authenticate(request)
        if result is not None:
            return result
    raise errors.AuthenticationFailed()
