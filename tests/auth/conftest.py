"""Fixtures of the auth tests: Users with passwords, logins, and a second (test) scheme."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import pytest
from fastapi import Request

from agent_gateway.auth import service as auth_service
from agent_gateway.auth.schemes import Authenticated
from agent_gateway.gateway import Gateway
from agent_gateway.store.queries.users import User
from agent_gateway.users import service as users_service

PASSWORD = "correct horse battery staple"

MakeUser = Callable[..., Awaitable[User]]


@pytest.fixture
def make_user(gateway: Gateway) -> MakeUser:
    """Admit a User and give it ``password`` (None: no password)."""

    async def make(password: str | None = PASSWORD) -> User:
        async with gateway.store.transaction() as conn:
            user = await users_service.admit(conn)
            if password is not None:
                await auth_service.set_password(conn, user.id, password, cost=gateway.settings.scrypt)
        return user

    return make


async def login(public: httpx.AsyncClient, user_id: str, password: str = PASSWORD) -> httpx.Response:
    return await public.post("/auth/tokens", json={"user": user_id, "password": password})


async def token_of(public: httpx.AsyncClient, user_id: str, password: str = PASSWORD) -> str:
    response = await login(public, user_id, password)
    assert response.status_code == 201, response.text
    return response.json()["token"]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class HeaderScheme:
    """A test scheme: ``X-Test-User: <id>`` authenticates as that User. It records who asked it."""

    HEADER = "x-test-user"

    def __init__(self) -> None:
        self.asked = 0

    async def authenticate(self, request: Request) -> Authenticated | None:
        self.asked += 1
        user_id = request.headers.get(self.HEADER)
        if user_id is None:
            return None
        async with request.app.state.store.read() as conn:
            try:
                user = await users_service.get(conn, user_id)
            except users_service.UserNotFound:
                return None
        return Authenticated(user, self)


@pytest.fixture
def header_scheme() -> HeaderScheme:
    return HeaderScheme()
