"""No input in a path or query parameter makes any route of either server answer 500.

NUL characters, invalid percent-encoded UTF-8 and very long values are the
classic ways through to a database error (PostgreSQL text cannot hold NUL),
so this runs on both backends. Routes are walked as in test_http_conventions;
a test authentication scheme lets every request past the Public server's
bearer check, so the parameters reach the handlers.
"""

from __future__ import annotations

import re

import httpx
import pytest
from fastapi import Request

from agent_gateway.auth import schemes
from agent_gateway.gateway import Gateway
from agent_gateway.store.queries.users import User
from agent_gateway.users import service as users
from tests.http.test_conventions import ENDPOINTS, Endpoint, assert_error

HOSTILE = ["%00", "x%00y", "%ED%A0%80", "%FF%FE", "a" * 5000, "9" * 400, "%E2%80%AE", "..%2F..%2Fetc", "%20", "-1"]
PARAMETERIZED = [
    endpoint for endpoint in ENDPOINTS if endpoint.server != "probe" and (endpoint.query_names or "{" in endpoint.path)
]


class EveryoneIs:
    """A scheme that authenticates every request as one User."""

    def __init__(self, user: User) -> None:
        self.user = user

    async def authenticate(self, request: Request) -> schemes.Authenticated | None:
        return schemes.Authenticated(self.user, self)


@pytest.mark.parametrize("endpoint", PARAMETERIZED, ids=str)
async def test_hostile_parameters_never_cause_a_500(
    endpoint: Endpoint, gateway: Gateway, agent: httpx.AsyncClient, public: httpx.AsyncClient
) -> None:
    async with gateway.store.transaction() as conn:
        gateway.auth_schemes.append(EveryoneIs(await users.admit(conn)))
    client = agent if endpoint.server == "agent" else public
    urls = []
    for value in HOSTILE:
        if "{" in endpoint.path:
            urls.append(re.sub(r"\{\w+(:\w+)?\}", value, endpoint.path))
        urls += [f"{endpoint.url}?{name}={value}" for name in endpoint.query_names]
    for url in urls:
        response = await client.request(endpoint.method, url)
        assert response.status_code < 500, (url, response.text)
        if response.status_code >= 400:
            assert_error(response, response.status_code)
        assert response.status_code != 401, "the test scheme should have authenticated the request"
