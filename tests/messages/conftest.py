"""Fixtures of the Message-log tests: admitted Users and the test authentication scheme."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from agent_gateway.gateway import Gateway
from agent_gateway.users import service as users

from tests.messages.records import UserIdScheme


@pytest.fixture
def authenticating(gateway: Gateway) -> Gateway:
    """The gateway with :class:`UserIdScheme` registered."""
    gateway.auth_schemes.append(UserIdScheme())
    return gateway


@pytest.fixture
def admit(gateway: Gateway) -> Callable[[], Awaitable[str]]:
    """Admit a User; returns its id."""

    async def admit() -> str:
        async with gateway.store.transaction() as conn:
            return (await users.admit(conn)).id

    return admit
