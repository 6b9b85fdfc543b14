"""The operator-side programmatic operations and what the store keeps (spec: Authentication 8-9)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from agent_gateway import clock, errors
from agent_gateway.auth import service as auth_service
from agent_gateway.auth import tokens
from agent_gateway.gateway import Gateway
from agent_gateway.store import tables
from agent_gateway.users import service as users_service

from tests.auth.conftest import PASSWORD, MakeUser, bearer, login, token_of

UNKNOWN_ID = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"


async def test_set_password_gives_a_first_password(public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser):
    user = await make_user(None)
    assert (await login(public, user.id, "first")).status_code == 401
    async with gateway.store.transaction() as conn:
        await auth_service.set_password(conn, user.id, "first", cost=gateway.settings.scrypt)
    assert (await login(public, user.id, "first")).status_code == 201


async def test_set_password_replaces_without_the_current_one_and_revokes_nothing(
    public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser
):
    user = await make_user()
    token = await token_of(public, user.id)
    async with gateway.store.transaction() as conn:
        await auth_service.set_password(conn, user.id, "replaced", cost=gateway.settings.scrypt)
    assert (await login(public, user.id)).status_code == 401
    assert (await login(public, user.id, "replaced")).status_code == 201
    assert (await public.get("/users/me", headers=bearer(token))).status_code == 200


async def test_set_password_has_no_length_bound(gateway: Gateway, make_user: MakeUser):
    user = await make_user(None)
    long = "ß" * 5000
    async with gateway.store.transaction() as conn:
        await auth_service.set_password(conn, user.id, long, cost=gateway.settings.scrypt)
    issued = await auth_service.log_in(
        gateway.store, user.id, long, cost=gateway.settings.scrypt, ttl_ms=gateway.settings.token_ttl_ms
    )
    assert issued.user.id == user.id


async def test_set_password_takes_the_callers_transaction(gateway: Gateway, make_user: MakeUser):
    user = await make_user()
    with pytest.raises(RuntimeError):
        async with gateway.store.transaction() as conn:
            await auth_service.set_password(conn, user.id, "rolled back", cost=gateway.settings.scrypt)
            raise RuntimeError("abort")
    settings = gateway.settings
    await auth_service.log_in(gateway.store, user.id, PASSWORD, cost=settings.scrypt, ttl_ms=settings.token_ttl_ms)


async def test_set_password_for_nobody_raises_and_writes_nothing(gateway: Gateway):
    async with gateway.store.transaction() as conn:
        with pytest.raises(users_service.UserNotFound):
            await auth_service.set_password(conn, UNKNOWN_ID, "pw", cost=gateway.settings.scrypt)
        assert (await conn.execute(sa.select(sa.func.count()).select_from(tables.users))).scalar() == 0


async def test_set_password_refuses_a_lone_surrogate(gateway: Gateway, make_user: MakeUser):
    user = await make_user()
    async with gateway.store.transaction() as conn:
        with pytest.raises(errors.InvalidInput):
            await auth_service.set_password(conn, user.id, "\udc80", cost=gateway.settings.scrypt)


async def test_issue_token_to_a_user_without_password(public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser):
    user = await make_user(None)
    with clock.use(clock.FrozenClock("2026-11-21T10:00:00.000Z")):
        async with gateway.store.transaction() as conn:
            issued = await auth_service.issue_token(conn, user.id, ttl_ms=gateway.settings.token_ttl_ms)
    assert issued.to_json() == {"token": issued.token, "expiresAt": "2026-11-21T11:00:00.000Z", "user": user.to_json()}
    assert issued.token.startswith(tokens.PREFIX)
    with clock.use(clock.FrozenClock("2026-11-21T10:59:59.999Z")):
        assert (await public.get("/users/me", headers=bearer(issued.token))).status_code == 200
    with clock.use(clock.FrozenClock("2026-11-21T11:00:00.000Z")):
        assert (await public.get("/users/me", headers=bearer(issued.token))).status_code == 401


async def test_issue_token_for_nobody_raises(gateway: Gateway):
    async with gateway.store.transaction() as conn:
        with pytest.raises(users_service.UserNotFound):
            await auth_service.issue_token(conn, UNKNOWN_ID, ttl_ms=1000)
        assert (await conn.execute(sa.select(sa.func.count()).select_from(tables.tokens))).scalar() == 0


async def test_revoke_tokens_is_idempotent_and_per_user(public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser):
    alice, bob = await make_user(), await make_user()
    alice_tokens = [await token_of(public, alice.id) for _ in range(2)]
    bob_token = await token_of(public, bob.id)
    for _ in range(2):
        async with gateway.store.transaction() as conn:
            assert await auth_service.revoke_tokens(conn, alice.id) is None
    async with gateway.store.transaction() as conn:
        await auth_service.revoke_tokens(conn, UNKNOWN_ID)
    for token in alice_tokens:
        assert (await public.get("/users/me", headers=bearer(token))).status_code == 401
    assert (await public.get("/users/me", headers=bearer(bob_token))).status_code == 200
    assert (await login(public, alice.id)).status_code == 201


async def test_log_in_refusals_are_indistinguishable(gateway: Gateway, make_user: MakeUser):
    user, passwordless = await make_user(), await make_user(None)
    settings = gateway.settings
    messages = set()
    for user_id, password in ((user.id, "wrong"), (UNKNOWN_ID, PASSWORD), (passwordless.id, PASSWORD)):
        with pytest.raises(errors.AuthenticationFailed) as raised:
            await auth_service.log_in(gateway.store, user_id, password, cost=settings.scrypt, ttl_ms=settings.token_ttl_ms)
        messages.add((type(raised.value), raised.value.message))
    assert len(messages) == 1


async def test_no_token_or_password_plaintext_is_stored(public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser):
    user = await make_user()
    issued = [(await login(public, user.id)).json()["token"] for _ in range(2)]
    async with gateway.store.transaction() as conn:
        issued.append((await auth_service.issue_token(conn, user.id, ttl_ms=1000)).token)
    async with gateway.store.read() as conn:
        dump = repr([list(await conn.execute(sa.select(table))) for table in tables.metadata.sorted_tables])
        stored = [row.digest for row in await conn.execute(sa.select(tables.tokens.c.digest))]
    for secret in (*issued, *(token.removeprefix("agw_") for token in issued), PASSWORD):
        assert secret not in dump
    assert sorted(stored) == sorted(tokens.digest(token) for token in issued)
    if gateway.store.dialect == "sqlite":
        # Nor in the database files themselves, write-ahead log included.
        path = Path(gateway.settings.database_url.removeprefix("sqlite:///"))
        raw = b"".join(file.read_bytes() for file in (path, path.with_name(path.name + "-wal")) if file.exists())
        for secret in (*issued, PASSWORD):
            assert secret.encode() not in raw


async def test_nothing_emits_a_signal(public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser):
    user = await make_user()
    token = await token_of(public, user.id)
    await public.put("/auth/password", json={"currentPassword": PASSWORD, "newPassword": "n"}, headers=bearer(token))
    await public.delete("/auth/tokens/current", headers=bearer(token))
    async with gateway.store.transaction() as conn:
        await auth_service.issue_token(conn, user.id, ttl_ms=1000)
        await auth_service.revoke_tokens(conn, user.id)
    async with gateway.store.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(tables.signals))).scalar() == 0


async def test_the_lookup_sees_each_commit_at_once(public: httpx.AsyncClient, gateway: Gateway, make_user: MakeUser):
    # The authenticated path reads on connections of its own; they must never serve a stale snapshot.
    user = await make_user()
    token = await token_of(public, user.id)
    assert (await public.get("/users/me", headers=bearer(token))).json()["attributes"] == {}
    async with gateway.store.transaction() as conn:
        await users_service.set_attributes(conn, user.id, {"after": "login"})
    assert (await public.get("/users/me", headers=bearer(token))).json()["attributes"] == {"after": "login"}
    async with gateway.store.transaction() as conn:
        await auth_service.revoke_tokens(conn, user.id)
    assert (await public.get("/users/me", headers=bearer(token))).status_code == 401
