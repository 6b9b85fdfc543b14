"""Message logs on both servers, mounted at ``/messages``.

The server that receives a write decides its direction: the Public server
records inbound Messages of the authenticated User, the Agent server outbound
Messages to any User. Fields the spec names as stripped (``userId`` on the
Public server, ``direction`` on the Agent server) are simply not declared, so
they never reach the service.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from agent_gateway import errors
from agent_gateway.auth import schemes
from agent_gateway.http import params
from agent_gateway.http.app import router as new_router
from agent_gateway.http.routing import error_responses, json_response
from agent_gateway.messages import service
from agent_gateway.store.window import Window

PREFIX = "/messages"
TEXT = Field(min_length=1, description="any non-empty string; NUL characters are refused")


class MessageOut(BaseModel):
    id: str
    userId: str
    direction: str = Field(examples=["inbound"])
    seq: int
    text: str
    createdAt: str


class MessageList(BaseModel):
    messages: list[MessageOut]


class InboundIn(BaseModel):
    # strict: a number or array where a string is due is 400, never coerced.
    model_config = ConfigDict(strict=True)

    text: Annotated[str, TEXT]


class OutboundIn(BaseModel):
    model_config = ConfigDict(strict=True)

    userId: str = Field(description="UUID of the User whose log receives the Message")
    text: Annotated[str, TEXT]


def _page(messages: list[service.Message]) -> Any:
    return json_response({"messages": [message.to_json() for message in messages]})


# --- Agent server: any User's log, no authentication ---------------------------

agent = new_router()


@agent.get(
    PREFIX,
    responses={200: {"model": MessageList}},
    summary="Read a User's Message log (cursor window, ascending by seq)",
)
async def read_log(
    request: Request,
    window: Annotated[Window, Depends(params.cursor_window)],
    user: Annotated[str | None, Query(description="UUID of the User whose log is read (required)")] = None,
) -> Any:
    if user is None:
        raise errors.InvalidInput("user is required")
    user_id = params.uuid("user", user)
    messages = await service.read(request.app.state.store, user_id, window)
    return _page(messages)


@agent.post(
    PREFIX,
    status_code=201,
    responses={201: {"model": MessageOut}, **error_responses(404, 503)},
    summary="Send an outbound Message to a User",
)
async def send(request: Request, body: OutboundIn) -> Any:
    user_id = params.uuid("userId", body.userId)
    async with request.app.state.store.transaction() as conn:
        message = await service.send(conn, user_id, body.text)
    return json_response(message.to_json(), 201)


# --- Public server: the authenticated User's own log ---------------------------

public = new_router()
Caller = Annotated[schemes.Authenticated, Depends(schemes.authenticated)]


@public.get(
    PREFIX,
    responses={200: {"model": MessageList}, **error_responses(401)},
    summary="Read your Message log (cursor window, ascending by seq)",
)
async def read_own_log(
    request: Request, caller: Caller, window: Annotated[Window, Depends(params.cursor_window)]
) -> Any:
    messages = await service.read(request.app.state.store, caller.user.id, window)
    return _page(messages)


@public.post(
    PREFIX,
    status_code=201,
    responses={201: {"model": MessageOut}, **error_responses(401, 503)},
    summary="Send an inbound Message to the agent (its answer arrives later in the same log)",
)
async def receive(request: Request, caller: Caller, body: InboundIn) -> Any:
    async with request.app.state.store.transaction() as conn:
        message = await service.receive(conn, caller.user.id, body.text)
    return json_response(message.to_json(), 201)
