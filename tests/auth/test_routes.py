"""The Public server's /auth routes and GET /users/me (spec: Public server; Route semantics 9-10)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from datetime import timedelta

import httpx
import pytest

from agent_gateway import clock
from agent_gateway.auth import passwords
from agent_gateway.auth import service as auth_service
from agent_gateway.gateway import Gateway
from agent_gateway.users import service as users_service

from tests.auth.conftest import PASSWORD, MakeUser, bearer, login, token_of

UNKNOWN_ID = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"
PROTECTED = [
    ("PUT", "/auth/password", {"currentPassword": PASSWORD, "newPassword": "another one"}),
    ("DELETE", "/auth/tokens", None),
    ("DELETE", "/auth/tokens/current", None),
    ("GET", "/users/me", None),
]


async def call(public: httpx.AsyncClient, method: str, path: str, body: object, headers: dict[str, str] | None = None):
    return await public.request(method, path, json=body, headers=headers)


async def me(public: httpx.AsyncClient, token: str) -> httpx.Response:
    return await public.get("/users/me", headers=bearer(token))


# --- POST /auth/tokens -------------------------------------------------------------


async def test_login_answers_token_expiry_and_user(public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser):
    user = await make_user()
    async with gateway.store.transaction() as conn:
        user = await users_service.set_attributes(conn, user.id, {"team": "blue", "n": [1, 2]})
    frozen = clock.FrozenClock("2026-11-21T10:00:00.000Z")
    with clock.use(frozen):
        response = await login(public, user.id)
    assert response.status_code == 201
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"token", "expiresAt", "user"}
    assert body["token"].startswith("agw_") and len(body["token"]) == 4 + 43
    # expiresAt = issue time + the deployment's lifetime (settings: one hour).
    assert body["expiresAt"] == "2026-11-21T11:00:00.000Z"
    assert body["user"] == user.to_json() == {"id": user.id, "attributes": {"team": "blue", "n": [1, 2]}, "createdAt": user.created_at}


async def test_each_login_is_a_new_token_and_all_work(public: httpx.AsyncClient, make_user: MakeUser):
    user = await make_user()
    tokens = [await token_of(public, user.id) for _ in range(3)]
    assert len(set(tokens)) == 3
    for token in tokens:
        assert (await me(public, token)).status_code == 200


async def test_login_takes_an_upper_case_id(public: httpx.AsyncClient, make_user: MakeUser):
    user = await make_user()
    response = await login(public, user.id.upper())
    assert response.status_code == 201
    assert response.json()["user"]["id"] == user.id


@pytest.mark.parametrize(
    "body",
    [
        {"user": "not-a-uuid", "password": PASSWORD},
        {"user": "0b1c2d3e4f504a6b8c7d9e0f1a2b3c4d", "password": PASSWORD},
        {"user": "", "password": PASSWORD},
        {"user": 12, "password": PASSWORD},
        {"user": None, "password": PASSWORD},
        {"password": PASSWORD},
        {"user": "{id}"},
        {"user": "{id}", "password": ""},
        {"user": "{id}", "password": None},
        {"user": "{id}", "password": 12345678},
        {"user": "{id}", "password": ["x"]},
        {"user": "{id}", "password": "x" * 1025},
        {"user": "{id}\u0000", "password": PASSWORD},
        [],
        "text",
        None,
    ],
)
async def test_login_refuses_invalid_input(public: httpx.AsyncClient, make_user: MakeUser, body: object):
    user = await make_user()
    if isinstance(body, dict):
        body = {key: value.replace("{id}", user.id) if isinstance(value, str) else value for key, value in body.items()}
    response = await public.post("/auth/tokens", json=body)
    assert response.status_code == 400, response.text
    assert set(response.json()) == {"statusCode", "error", "message"}
    assert response.json()["statusCode"] == 400


async def test_login_without_body_or_with_malformed_json_is_400(public: httpx.AsyncClient):
    assert (await public.post("/auth/tokens")).status_code == 400
    malformed = await public.post("/auth/tokens", content=b'{"user": ', headers={"content-type": "application/json"})
    assert malformed.status_code == 400
    not_json = await public.post("/auth/tokens", content=b"user=x", headers={"content-type": "application/x-www-form-urlencoded"})
    assert not_json.status_code == 415


@pytest.mark.parametrize("length", [0, 1, 1024, 1025])
async def test_login_password_length_edges(public: httpx.AsyncClient, make_user: MakeUser, length: int):
    # A multi-byte character: the limit counts characters, not bytes.
    password = "é" * length
    user = await make_user(password)
    response = await login(public, user.id, password)
    assert response.status_code == (201 if 1 <= length <= 1024 else 400), response.text


async def test_login_refuses_a_query_parameter(public: httpx.AsyncClient, make_user: MakeUser):
    user = await make_user()
    response = await public.post("/auth/tokens?user=" + user.id, json={"user": user.id, "password": PASSWORD})
    assert response.status_code == 400


async def test_password_in_url_is_refused_and_never_logs_in(public: httpx.AsyncClient, make_user: MakeUser):
    user = await make_user()
    response = await public.post(f"/auth/tokens?password={PASSWORD}", json={"user": user.id, "password": "wrong"})
    assert response.status_code == 400


async def test_extra_body_fields_are_ignored(public: httpx.AsyncClient, make_user: MakeUser):
    user = await make_user()
    response = await public.post(
        "/auth/tokens", json={"user": user.id, "password": PASSWORD, "expiresAt": "2999-01-01T00:00:00.000Z"}
    )
    assert response.status_code == 201
    assert response.json()["expiresAt"] != "2999-01-01T00:00:00.000Z"


# --- every authentication failure is the same 401 ----------------------------------


async def test_every_authentication_failure_is_the_same_401(public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser):
    user, passwordless = await make_user(), await make_user(None)
    frozen = clock.FrozenClock("2026-11-21T10:00:00.000Z")
    with clock.use(frozen):
        expired = await token_of(public, user.id)
        revoked = await token_of(public, user.id)
        await public.delete("/auth/tokens/current", headers=bearer(revoked))
        frozen.advance(milliseconds=gateway.settings.token_ttl_ms)
        live = await token_of(public, user.id)
        failures = [
            await login(public, user.id, "wrong password"),
            await login(public, UNKNOWN_ID),
            await login(public, passwordless.id),
            await public.get("/users/me"),
            await public.get("/users/me", headers={"Authorization": "Bearer"}),
            await public.get("/users/me", headers={"Authorization": "Bearer "}),
            await public.get("/users/me", headers={"Authorization": "Bearer not-a-token"}),
            await public.get("/users/me", headers={"Authorization": "Bearer agw_" + "A" * 43}),
            await public.get("/users/me", headers={"Authorization": f"Basic {live}"}),
            await public.get("/users/me", headers={"Authorization": f"Bearer {live}x"}),
            await public.get("/users/me", headers={"Authorization": f"Bearer {live[:-1]}"}),
            await public.get("/users/me", headers={"Authorization": f"Bearer {live} {live}"}),
            await public.get("/users/me", headers={"Authorization": f"Bearer {expired}"}),
            await public.get("/users/me", headers={"Authorization": f"Bearer {revoked}"}),
        ]
        assert (await me(public, live)).status_code == 200
    first = failures[0]
    assert first.status_code == 401
    assert first.json() == {"statusCode": 401, "error": "Unauthorized", "message": first.json()["message"]}
    for response in failures:
        assert (response.status_code, response.content) == (401, first.content)
        assert response.headers["content-type"] == "application/json"
        assert response.headers.get("www-authenticate") == first.headers.get("www-authenticate")


async def test_concurrent_requests_are_each_authenticated_by_their_own_token(
    public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser
):
    # On PostgreSQL the checks of concurrent requests go many to a statement (auth.tokens).
    users = [await make_user() for _ in range(4)]
    frozen = clock.FrozenClock("2026-11-21T10:00:00.000Z")
    with clock.use(frozen):
        expired = await token_of(public, users[0].id)
        frozen.advance(milliseconds=gateway.settings.token_ttl_ms)
        live = {await token_of(public, user.id): user.id for user in users}
        revoked = await token_of(public, users[1].id)
        assert (await public.delete("/auth/tokens/current", headers=bearer(revoked))).status_code == 204
        tokens = [*live, expired, revoked, "agw_" + "C" * 43] * 8
        responses = await asyncio.gather(*(me(public, token) for token in tokens))
    for token, response in zip(tokens, responses, strict=True):
        if token in live:
            assert (response.status_code, response.json()["id"]) == (200, live[token])
        else:
            assert response.status_code == 401


@pytest.mark.parametrize(("method", "path", "body"), PROTECTED)
async def test_protected_routes_refuse_a_missing_or_bad_token(public: httpx.AsyncClient, method: str, path: str, body: object):
    login_failure = await login(public, UNKNOWN_ID)
    for headers in (None, bearer("agw_" + "B" * 43)):
        response = await call(public, method, path, body, headers)
        assert (response.status_code, response.content) == (401, login_failure.content)


@pytest.mark.parametrize(("method", "path", "body"), PROTECTED)
async def test_protected_routes_refuse_query_parameters(public: httpx.AsyncClient, make_user: MakeUser, method: str, path: str, body: object):
    user = await make_user()
    token = await token_of(public, user.id)
    for query in ("?x=1", f"?user={user.id}", "?token=" + token):
        response = await call(public, method, path + query, body, bearer(token))
        assert response.status_code == 400, (path, query)
    # Nothing was done: the Token still works, the password is unchanged.
    assert (await me(public, token)).status_code == 200
    assert (await login(public, user.id)).status_code == 201


async def test_the_bearer_scheme_name_is_case_insensitive(public: httpx.AsyncClient, make_user: MakeUser):
    user = await make_user()
    token = await token_of(public, user.id)
    response = await public.get("/users/me", headers={"Authorization": f"bearer {token}"})
    assert response.status_code == 200


# --- expiry ---------------------------------------------------------------------------


async def test_a_token_expires_after_the_deployment_lifetime(public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser):
    user = await make_user()
    frozen = clock.FrozenClock("2026-11-21T10:00:00.000Z")
    with clock.use(frozen):
        token = await token_of(public, user.id)
        frozen.advance(milliseconds=gateway.settings.token_ttl_ms - 1)
        assert (await me(public, token)).status_code == 200
        frozen.advance(milliseconds=1)
        assert clock.now_iso() == "2026-11-21T11:00:00.000Z"
        assert (await me(public, token)).status_code == 401
        # Nothing renews it, and a fresh login is a fresh lifetime.
        fresh = await login(public, user.id)
        assert fresh.json()["expiresAt"] == "2026-11-21T12:00:00.000Z"
        assert (await me(public, token)).status_code == 401


async def test_the_lifetime_is_the_deployments(settings):
    gateway = Gateway(dataclasses.replace(settings, token_ttl_ms=1500))
    await gateway.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.public_app), base_url="http://p") as client:
            async with gateway.store.transaction() as conn:
                user = await users_service.admit(conn)
                await auth_service.set_password(conn, user.id, PASSWORD, cost=settings.scrypt)
            with clock.use(clock.FrozenClock("2026-11-21T10:00:00.000Z")):
                response = await login(client, user.id)
        assert response.json()["expiresAt"] == "2026-11-21T10:00:01.500Z"
    finally:
        await gateway.stop()


# --- PUT /auth/password ---------------------------------------------------------------


async def test_rotation_changes_the_password_and_revokes_nothing(public: httpx.AsyncClient, make_user: MakeUser):
    user = await make_user()
    old_tokens = [await token_of(public, user.id) for _ in range(2)]
    response = await public.put(
        "/auth/password", json={"currentPassword": PASSWORD, "newPassword": "new password"}, headers=bearer(old_tokens[0])
    )
    assert response.status_code == 204
    assert response.content == b""
    for token in old_tokens:
        assert (await me(public, token)).status_code == 200
    assert (await login(public, user.id)).status_code == 401
    assert (await login(public, user.id, "new password")).status_code == 201


async def test_rotation_with_a_wrong_current_password_is_401_and_changes_nothing(public: httpx.AsyncClient, make_user: MakeUser):
    user = await make_user()
    token = await token_of(public, user.id)
    response = await public.put(
        "/auth/password", json={"currentPassword": "wrong", "newPassword": "new password"}, headers=bearer(token)
    )
    assert (response.status_code, response.content) == (401, (await login(public, UNKNOWN_ID)).content)
    assert (await login(public, user.id)).status_code == 201
    assert (await login(public, user.id, "new password")).status_code == 401
    assert (await me(public, token)).status_code == 200


async def test_rotation_for_a_user_without_password_is_the_same_401(public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser):
    user = await make_user(None)
    async with gateway.store.transaction() as conn:
        issued = await auth_service.issue_token(conn, user.id, ttl_ms=gateway.settings.token_ttl_ms)
    response = await public.put(
        "/auth/password", json={"currentPassword": "anything", "newPassword": "new password"}, headers=bearer(issued.token)
    )
    assert (response.status_code, response.content) == (401, (await login(public, UNKNOWN_ID)).content)
    assert (await login(public, user.id, "new password")).status_code == 401


async def test_rotation_strips_a_user_field(public: httpx.AsyncClient, make_user: MakeUser):
    alice, bob = await make_user(), await make_user()
    token = await token_of(public, alice.id)
    response = await public.put(
        "/auth/password",
        json={"currentPassword": PASSWORD, "newPassword": "alice's new one", "user": bob.id},
        headers=bearer(token),
    )
    assert response.status_code == 204
    assert (await login(public, alice.id, "alice's new one")).status_code == 201
    assert (await login(public, bob.id)).status_code == 201
    assert (await login(public, bob.id, "alice's new one")).status_code == 401


@pytest.mark.parametrize("field", ["currentPassword", "newPassword"])
@pytest.mark.parametrize("length", [0, 1, 1024, 1025])
async def test_rotation_password_length_edges(
    public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser, field: str, length: int
):
    current = "ü" * length if field == "currentPassword" else PASSWORD
    new = "ü" * length if field == "newPassword" else PASSWORD
    # The operator sets any length, so even a 1025-character current password is the real one.
    user = await make_user(current)
    async with gateway.store.transaction() as conn:
        token = (await auth_service.issue_token(conn, user.id, ttl_ms=gateway.settings.token_ttl_ms)).token
    response = await public.put("/auth/password", json={"currentPassword": current, "newPassword": new}, headers=bearer(token))
    assert response.status_code == (204 if 1 <= length <= 1024 else 400), response.text
    if response.status_code == 204:
        assert (await login(public, user.id, new)).status_code == 201


@pytest.mark.parametrize(
    "body",
    [
        {"newPassword": "new"},
        {"currentPassword": PASSWORD},
        {"currentPassword": PASSWORD, "newPassword": None},
        {"currentPassword": 1, "newPassword": "new"},
        {"currentPassword": PASSWORD, "newPassword": {"a": 1}},
        [],
        None,
    ],
)
async def test_rotation_refuses_invalid_bodies(public: httpx.AsyncClient, make_user: MakeUser, body: object):
    user = await make_user()
    token = await token_of(public, user.id)
    response = await public.put("/auth/password", json=body, headers=bearer(token))
    assert response.status_code == 400
    assert (await login(public, user.id)).status_code == 201


async def test_concurrent_rotations_one_wins(public: httpx.AsyncClient, make_user: MakeUser):
    user = await make_user()
    token = await token_of(public, user.id)
    responses = await asyncio.gather(
        *(
            public.put("/auth/password", json={"currentPassword": PASSWORD, "newPassword": f"new {n}"}, headers=bearer(token))
            for n in range(4)
        )
    )
    statuses = sorted(response.status_code for response in responses)
    assert statuses[0] == 204 and set(statuses) <= {204, 401}
    # Exactly one new password is in force, and it belongs to a rotation that answered 204.
    winners = [n for n in range(4) if (await login(public, user.id, f"new {n}")).status_code == 201]
    assert len(winners) == 1
    assert responses[winners[0]].status_code == 204


# --- DELETE /auth/tokens and /auth/tokens/current ---------------------------------------


async def test_delete_tokens_revokes_every_token_of_the_user_only(public: httpx.AsyncClient, make_user: MakeUser):
    alice, bob = await make_user(), await make_user()
    alice_tokens = [await token_of(public, alice.id) for _ in range(3)]
    bob_token = await token_of(public, bob.id)
    response = await public.delete("/auth/tokens", headers=bearer(alice_tokens[1]))
    assert (response.status_code, response.content) == (204, b"")
    for token in alice_tokens:
        assert (await me(public, token)).status_code == 401
    assert (await me(public, bob_token)).status_code == 200
    # Revoking is not a lock-out: the password still logs in.
    assert (await me(public, await token_of(public, alice.id))).status_code == 200


async def test_delete_current_revokes_only_the_presented_token(public: httpx.AsyncClient, make_user: MakeUser):
    alice, bob = await make_user(), await make_user()
    presented, other = await token_of(public, alice.id), await token_of(public, alice.id)
    bob_token = await token_of(public, bob.id)
    response = await public.delete("/auth/tokens/current", headers=bearer(presented))
    assert (response.status_code, response.content) == (204, b"")
    assert (await me(public, presented)).status_code == 401
    assert (await me(public, other)).status_code == 200
    assert (await me(public, bob_token)).status_code == 200
    # Idempotent in effect: presenting it again is just an unknown Token.
    again = await public.delete("/auth/tokens/current", headers=bearer(presented))
    assert again.status_code == 401


@pytest.mark.parametrize("path", ["/auth/tokens", "/auth/tokens/current"])
async def test_delete_routes_ignore_a_body(public: httpx.AsyncClient, make_user: MakeUser, path: str):
    alice, bob = await make_user(), await make_user()
    token, bob_token = await token_of(public, alice.id), await token_of(public, bob.id)
    response = await public.request("DELETE", path, json={"user": bob.id}, headers=bearer(token))
    assert response.status_code == 204
    assert (await me(public, bob_token)).status_code == 200


# --- GET /users/me ----------------------------------------------------------------------


async def test_me_is_the_authenticated_user_with_attributes(public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser):
    alice, bob = await make_user(), await make_user()
    async with gateway.store.transaction() as conn:
        alice = await users_service.set_attributes(conn, alice.id, None)
        bob = await users_service.set_attributes(conn, bob.id, {"role": "admin", "ü": "\u0000"})
    assert (await me(public, await token_of(public, alice.id))).json() == alice.to_json()
    response = await me(public, await token_of(public, bob.id))
    assert response.status_code == 200
    assert response.json() == {"id": bob.id, "attributes": {"role": "admin", "ü": "\u0000"}, "createdAt": bob.created_at}
    # Attributes written after login are read fresh: the Token names the User, not a copy.
    async with gateway.store.transaction() as conn:
        await users_service.set_attributes(conn, bob.id, [1])
    token = await token_of(public, bob.id)
    assert (await me(public, token)).json()["attributes"] == [1]


async def test_an_operator_issued_token_is_ordinary(public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser):
    user = await make_user(None)
    async with gateway.store.transaction() as conn:
        issued = await auth_service.issue_token(conn, user.id, ttl_ms=gateway.settings.token_ttl_ms)
    assert (await me(public, issued.token)).json() == user.to_json()
    assert (await public.delete("/auth/tokens/current", headers=bearer(issued.token))).status_code == 204
    assert (await me(public, issued.token)).status_code == 401


# --- logins never stall other requests ---------------------------------------------------


async def test_a_login_does_not_block_other_requests(
    public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser, monkeypatch: pytest.MonkeyPatch
):
    # The derivation is held until another request has been answered: were it
    # run on the event loop, that request could never be served meanwhile.
    user = await make_user()
    async with gateway.store.transaction() as conn:
        issued = await auth_service.issue_token(conn, user.id, ttl_ms=gateway.settings.token_ttl_ms)
    entered, release = threading.Event(), threading.Event()
    derive = passwords._derive

    def held_derive(*args):
        entered.set()
        if not release.wait(timeout=300):
            raise AssertionError("the derivation blocked the event loop")
        return derive(*args)

    monkeypatch.setattr(passwords, "_derive", held_derive)
    logging_in = asyncio.create_task(login(public, user.id))
    while not entered.is_set():
        await asyncio.sleep(0.001)
    assert (await me(public, issued.token)).status_code == 200
    assert not logging_in.done()
    release.set()
    assert (await logging_in).status_code == 201


async def test_concurrent_logins_all_succeed(public: httpx.AsyncClient, make_user: MakeUser):
    users = [await make_user() for _ in range(3)]
    responses = await asyncio.gather(*(login(public, user.id) for user in users for _ in range(3)))
    assert [response.status_code for response in responses] == [201] * 9
    assert len({response.json()["token"] for response in responses}) == 9


def test_expiry_arithmetic_is_in_milliseconds():
    issued = clock.parse_instant("2026-01-31T23:59:59.999Z")
    assert clock.format_instant(issued + timedelta(milliseconds=1)) == "2026-02-01T00:00:00.000Z"
