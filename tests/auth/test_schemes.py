"""The ordered registry of authentication schemes (spec: Authentication 2, 6; DELETE /auth/tokens/current)."""

from __future__ import annotations

import httpx

from agent_gateway.auth.tokens import PasswordScheme
from agent_gateway.gateway import Gateway

from tests.auth.conftest import HeaderScheme, MakeUser, bearer, login, token_of

UNKNOWN_ID = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"


def test_the_password_scheme_is_registered_by_default(gateway: Gateway):
    assert [type(scheme) for scheme in gateway.auth_schemes] == [PasswordScheme]
    assert gateway.public_app.state.auth_schemes is gateway.auth_schemes


async def test_with_no_scheme_every_protected_route_is_401(public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser):
    user = await make_user()
    token = await token_of(public, user.id)
    gateway.auth_schemes.clear()
    failure = (await login(public, UNKNOWN_ID)).content
    rotation = {"currentPassword": "correct horse battery staple", "newPassword": "new"}
    for method, path, body in (
        ("GET", "/users/me", None),
        ("PUT", "/auth/password", rotation),
        ("DELETE", "/auth/tokens", None),
        ("DELETE", "/auth/tokens/current", None),
    ):
        response = await public.request(method, path, json=body, headers=bearer(token))
        assert (response.status_code, response.content) == (401, failure)
    # Login needs no scheme, and nothing above revoked the Token.
    assert (await login(public, user.id)).status_code == 201
    gateway.auth_schemes.append(gateway.password_scheme)
    assert (await public.get("/users/me", headers=bearer(token))).status_code == 200


async def test_a_request_without_a_bearer_header_goes_to_the_next_scheme(
    public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser, header_scheme: HeaderScheme
):
    user = await make_user(None)
    gateway.auth_schemes.append(header_scheme)
    response = await public.get("/users/me", headers={HeaderScheme.HEADER: user.id})
    assert response.status_code == 200
    assert response.json() == user.to_json()
    assert header_scheme.asked == 1


async def test_a_bearer_token_the_password_scheme_refuses_goes_to_the_next_scheme(
    public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser, header_scheme: HeaderScheme
):
    user = await make_user(None)
    gateway.auth_schemes.append(header_scheme)
    for authorization in ("Bearer agw_" + "C" * 43, "Bearer some.jwt.here", "Basic dXNlcjpwdw=="):
        response = await public.get("/users/me", headers={"Authorization": authorization, HeaderScheme.HEADER: user.id})
        assert response.json() == user.to_json()


async def test_schemes_are_asked_in_registration_order(
    public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser, header_scheme: HeaderScheme
):
    alice, bob = await make_user(), await make_user()
    token = await token_of(public, alice.id)
    headers = {**bearer(token), HeaderScheme.HEADER: bob.id}
    gateway.auth_schemes.append(header_scheme)
    assert (await public.get("/users/me", headers=headers)).json()["id"] == alice.id
    assert header_scheme.asked == 0  # the first scheme answered; the second was not asked
    gateway.auth_schemes.insert(0, gateway.auth_schemes.pop())
    assert (await public.get("/users/me", headers=headers)).json()["id"] == bob.id
    assert header_scheme.asked == 1


async def test_when_every_scheme_refuses_it_is_the_same_401(
    public: httpx.AsyncClient, gateway: Gateway, header_scheme: HeaderScheme
):
    gateway.auth_schemes.append(header_scheme)
    failure = (await login(public, UNKNOWN_ID)).content
    for headers in ({}, {HeaderScheme.HEADER: UNKNOWN_ID}, {"Authorization": "Bearer agw_" + "D" * 43}):
        response = await public.get("/users/me", headers=headers)
        assert (response.status_code, response.content) == (401, failure)


async def test_delete_current_by_another_scheme_answers_204_and_drops_nothing(
    public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser, header_scheme: HeaderScheme
):
    user = await make_user()
    token = await token_of(public, user.id)
    gateway.auth_schemes.insert(0, header_scheme)
    # Even with the Token also presented, the request is the other scheme's: nothing is dropped.
    for headers in ({HeaderScheme.HEADER: user.id}, {HeaderScheme.HEADER: user.id, **bearer(token)}):
        response = await public.delete("/auth/tokens/current", headers=headers)
        assert (response.status_code, response.content) == (204, b"")
    assert (await public.get("/users/me", headers=bearer(token))).json()["id"] == user.id


async def test_delete_current_by_the_password_scheme_with_another_registered(
    public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser, header_scheme: HeaderScheme
):
    user = await make_user()
    token, other = await token_of(public, user.id), await token_of(public, user.id)
    gateway.auth_schemes.append(header_scheme)
    response = await public.delete("/auth/tokens/current", headers={**bearer(token), HeaderScheme.HEADER: user.id})
    assert response.status_code == 204
    gateway.auth_schemes.remove(header_scheme)
    assert (await public.get("/users/me", headers=bearer(token))).status_code == 401
    assert (await public.get("/users/me", headers=bearer(other))).status_code == 200


async def test_delete_all_by_another_scheme_revokes_the_users_tokens(
    public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser, header_scheme: HeaderScheme
):
    user, bystander = await make_user(), await make_user()
    token, kept = await token_of(public, user.id), await token_of(public, bystander.id)
    gateway.auth_schemes.append(header_scheme)
    response = await public.delete("/auth/tokens", headers={HeaderScheme.HEADER: user.id})
    assert response.status_code == 204
    assert (await public.get("/users/me", headers=bearer(token))).status_code == 401
    assert (await public.get("/users/me", headers=bearer(kept))).status_code == 200


async def test_rotation_by_another_scheme_still_proves_the_current_password(
    public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser, header_scheme: HeaderScheme
):
    user = await make_user()
    gateway.auth_schemes.append(header_scheme)
    wrong = await public.put(
        "/auth/password", json={"currentPassword": "wrong", "newPassword": "new"}, headers={HeaderScheme.HEADER: user.id}
    )
    assert wrong.status_code == 401
    right = await public.put(
        "/auth/password",
        json={"currentPassword": "correct horse battery staple", "newPassword": "new"},
        headers={HeaderScheme.HEADER: user.id},
    )
    assert right.status_code == 204
    assert (await login(public, user.id, "new")).status_code == 201
