"""Agent server: POST /sign. Public server: GET /jwks.json, POST /verify."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway.auth import schemes
from agent_gateway.http.app import router as new_router
from agent_gateway import jsontext
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


class SignFastPath:
    """``POST /sign`` answered from the ASGI messages when the request is plainly valid.

    The route stores nothing and is the Agent server's busiest, and FastAPI's
    routing, dependency solving and body model cost several times its signature.
    A request with no query string, ``Content-Type: application/json`` and a
    ``Content-Length`` body within the limit that holds just a non-empty
    ``statement`` string and optionally a ``typ`` of 1..128 characters is signed
    here, by the route's own function, into the route's own response. Anything
    else, and any failure, goes to the route with its body, which applies every rule.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._candidate(scope):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            signed = self._sign(scope, body)
        except Exception:  # the route answers (and logs) it as it would any request
            signed = None
        if signed is None:
            await self.app(scope, _replay(body, receive), send)
            return
        headers = [(b"content-length", str(len(signed)).encode()), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": signed})

    def _candidate(self, scope: Scope) -> bool:
        if scope["type"] != "http" or scope["path"] != "/sign" or scope["method"] != "POST" or scope["query_string"]:
            return False
        length = content_type = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"content-type":
                content_type = value
        return content_type == b"application/json" and length is not None and length.isdigit() and int(length) <= self.limit

    def _sign(self, scope: Scope, body: bytes) -> bytes | None:
        fields = orjson.loads(body)
        if type(fields) is not dict or not fields.keys() <= {"statement", "typ"}:
            return None
        statement, typ = fields.get("statement"), fields.get("typ", service.STATEMENT_TYP)
        if type(statement) is not str or not statement:
            return None
        if type(typ) is not str or not 1 <= len(typ) <= service.MAX_TYP_LENGTH:
            return None
        return jsontext.dumps({"jws": service.sign_statement(scope["app"].state.identity, statement, typ)})


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with ``body``, already read, given back first."""
    replayed = False

    async def receive_again() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive_again


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
