"""Public server: login, password rotation, Token revocation and ``GET /users/me``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Body, Depends, Request
from starlette.responses import Response
from starlette.types import Scope
from pydantic import BaseModel, ConfigDict, Field

from agent_gateway import ids, jsontext, records
from agent_gateway.auth import service, tokens
from agent_gateway.auth.schemes import Authenticated, authenticated
from agent_gateway.http.fastpath import Answer
from agent_gateway.http.app import router as new_router
from agent_gateway.http.routing import error_responses, json_response, no_content

# Characters (code points), not bytes: DESIGN, "Points the spec leaves open".
MAX_PASSWORD_CHARS = 1024
Password = Annotated[str, Field(min_length=1, max_length=MAX_PASSWORD_CHARS)]


class LoginIn(BaseModel):
    # strict: a number or an array where a string belongs is 400, never coerced.
    model_config = ConfigDict(strict=True)

    user: str = Field(description="the User's id (UUID)")
    password: Password


class PasswordChangeIn(BaseModel):
    # A ``user`` field, like any other unknown one, is ignored: the User is the authenticated one.
    model_config = ConfigDict(strict=True)

    currentPassword: Password
    newPassword: Password


public = new_router()
Auth = Annotated[Authenticated, Depends(authenticated)]


@public.post(
    "/auth/tokens",
    status_code=201,
    responses={201: {"model": records.Token}, **error_responses(401)},
    summary="Log in: a bearer Token for a User's id and password",
)
async def log_in(request: Request, body: Annotated[LoginIn, Body()]) -> Any:
    user_id = ids.uuid("user", body.user)
    assert user_id is not None
    settings = request.app.state.settings
    issued = await service.log_in(
        request.app.state.store, user_id, body.password, cost=settings.scrypt, ttl_ms=settings.token_ttl_ms
    )
    return json_response(issued.to_json(), 201)


@public.put(
    "/auth/password",
    status_code=204,
    responses=error_responses(401),
    summary="Change the password (proving the current one); revokes no Token",
)
async def change_password(request: Request, auth: Auth, body: Annotated[PasswordChangeIn, Body()]) -> Response:
    await service.change_password(
        request.app.state.store,
        auth.user.id,
        body.currentPassword,
        body.newPassword,
        cost=request.app.state.settings.scrypt,
    )
    return no_content()


@public.delete(
    "/auth/tokens",
    status_code=204,
    responses=error_responses(401),
    summary="Revoke every Token of the authenticated User, the presented one included",
)
async def revoke_tokens(request: Request, auth: Auth) -> Response:
    async with request.app.state.store.transaction() as conn:
        await service.revoke_tokens(conn, auth.user.id)
    return no_content()


@public.delete(
    "/auth/tokens/current",
    status_code=204,
    responses=error_responses(401),
    summary="Revoke the presented Token only",
)
async def revoke_current_token(request: Request, auth: Auth) -> Response:
    # A request another scheme authenticated presented no Token: 204, nothing dropped.
    if isinstance(auth.scheme, tokens.PasswordScheme) and auth.token_digest is not None:
        async with request.app.state.store.transaction() as conn:
            await service.revoke_token(conn, auth.user.id, auth.token_digest)
    return no_content()


@public.get(
    "/users/me",
    responses={200: {"model": records.User}, **error_responses(401)},
    summary="The authenticated User, Attributes included",
)
async def read_me(auth: Auth) -> Any:
    return json_response(auth.user.to_json())


@public.fast(read_me)
async def fast_read_me(scope: Scope, query: dict[str, str]) -> Answer | None:
    """``read_me`` with no query, on the fast path (``http.fastpath``)."""
    if query:
        return None
    caller = await authenticated(Request(scope))
    return 200, jsontext.dumps(caller.user.to_json())
