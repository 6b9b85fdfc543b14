"""Agent server: POST /sign. Public server: GET /jwks.json, POST /verify."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import Scope

from agent_gateway.auth import schemes
from agent_gateway import jsontext
from agent_gateway.http.app import router as new_router
from agent_gateway.http.fastpath import Answer
from agent_gateway.http.routing import error_responses, json_response
from agent_gateway.signatures import service


class SignIn(BaseModel):
    model_config = ConfigDict(strict=True)

    statement: Annotated[str, Field(min_length=1)]
    typ: Annotated[str, Field(min_length=1, max_length=service.MAX_TYP_LENGTH)] = service.STATEMENT_TYP


class SignOut(BaseModel):
    jws: str


class Jwk(BaseModel):
    kty: str
    crv: str | None = None
    x: str | None = None
    y: str | None = None
    n: str | None = None
    e: str | None = None


class JwkSet(BaseModel):
    keys: list[Jwk]


class VerifyIn(BaseModel):
    model_config = ConfigDict(strict=True)

    jws: Annotated[str, Field(min_length=1)]


class VerifyOut(BaseModel):
    verified: bool
    header: Any = None
    payload: Any = None


agent = new_router()
public = new_router()


@agent.post("/sign", responses={200: {"model": SignOut}}, summary="Sign a Statement (stores nothing)")
async def sign(request: Request, body: SignIn) -> Any:
    return json_response({"jws": service.sign_statement(request.app.state.identity, body.statement, body.typ)})


@agent.fast(sign)
async def fast_sign(scope: Scope, fields: dict[str, Any]) -> Answer | None:
    """``sign`` on the fast path (``http.fastpath``): just a ``statement`` and maybe a ``typ``."""
    if not fields.keys() <= {"statement", "typ"}:
        return None
    statement, typ = fields.get("statement"), fields.get("typ", service.STATEMENT_TYP)
    if type(statement) is not str or not statement:
        return None
    if type(typ) is not str or not 1 <= len(typ) <= service.MAX_TYP_LENGTH:
        return None
    return 200, jsontext.dumps({"jws": service.sign_statement(scope["app"].state.identity, statement, typ)})


@public.get("/jwks.json", responses={200: {"model": JwkSet}}, summary="The public key, as a JWK Set")
async def jwks(request: Request) -> Any:
    return json_response(request.app.state.identity.jwks())


@public.post(
    "/verify",
    responses={200: {"model": VerifyOut}, **error_responses(401)},
    summary="Check an artifact against this gateway's key (offline verification needs no trust)",
)
async def verify(
    request: Request, body: VerifyIn, _: Annotated[schemes.Authenticated, Depends(schemes.authenticated)]
) -> Any:
    return json_response(service.verify(request.app.state.identity, body.jws))
