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
from starlette.responses import Response
from starlette.types import Scope
from pydantic import BaseModel, ConfigDict, Field

from agent_gateway import errors, ids, jsontext, records
from agent_gateway.auth import schemes
from agent_gateway.http import params
from agent_gateway.http.app import router as new_router
from agent_gateway.http.fastpath import Answer
from agent_gateway.http.routing import error_responses, json_response
from agent_gateway.ledger import receipt as receipts
from agent_gateway.messages import service
from agent_gateway.store.window import Window

PREFIX = "/messages"
TEXT = Field(min_length=1, description="any non-empty string; NUL characters are refused")


class InboundIn(BaseModel):
    # strict: a number or array where a string is due is 400, never coerced.
    model_config = ConfigDict(strict=True)

    text: Annotated[str, TEXT]


class OutboundIn(BaseModel):
    model_config = ConfigDict(strict=True)

    userId: str = Field(description="UUID of the User whose log receives the Message")
    text: Annotated[str, TEXT]


def _page(messages: list[service.Message]) -> bytes:
    return jsontext.dumps({"messages": [message.to_json() for message in messages]})


# --- Agent server: any User's log, no authentication ---------------------------

agent = new_router()


@agent.get(
    PREFIX,
    responses={200: {"model": records.MessageList}},
    summary="Read a User's Message log (cursor window, ascending by seq)",
)
async def read_log(
    request: Request,
    window: Annotated[Window, Depends(params.cursor_window)],
    user: Annotated[str | None, Query(description="UUID of the User whose log is read (required)")] = None,
) -> Any:
    if user is None:
        raise errors.InvalidInput("user is required")
    user_id = ids.uuid("user", user)
    messages = await service.read(request.app.state.store, user_id, window)
    return Response(_page(messages), media_type="application/json")


@agent.post(
    PREFIX,
    status_code=201,
    responses={201: {"model": records.Message}, **error_responses(404, 503)},
    summary="Send an outbound Message to a User",
)
async def send(request: Request, body: OutboundIn) -> Any:
    user_id = ids.uuid("userId", body.userId)
    message = await request.app.state.messages.send(user_id, body.text)
    return json_response(message.to_json(), 201)


# --- Public server: the authenticated User's own log ---------------------------

public = new_router()
Caller = Annotated[schemes.Authenticated, Depends(schemes.authenticated)]


@public.get(
    PREFIX,
    responses={200: {"model": records.MessageList}, **error_responses(401)},
    summary="Read your Message log (cursor window, ascending by seq)",
)
async def read_own_log(
    request: Request, caller: Caller, window: Annotated[Window, Depends(params.cursor_window)]
) -> Any:
    messages = await service.read(request.app.state.store, caller.user.id, window)
    return Response(_page(messages), media_type="application/json")


@public.post(
    PREFIX,
    status_code=201,
    responses={201: {"model": records.Message}, **error_responses(401, 503)},
    summary="Send an inbound Message to the agent (its answer arrives later in the same log)",
)
async def receive(request: Request, caller: Caller, body: InboundIn) -> Any:
    message = await request.app.state.messages.receive(caller.user.id, body.text)
    return json_response(message.to_json(), 201)


@public.get(
    PREFIX + "/{seq}/receipt",
    responses={200: {"model": receipts.Receipt}, **error_responses(401, 404)},
    summary="The receipt of one of your inbound Messages: the Run ledger's proof of what the agent was given",
)
async def receipt(request: Request, caller: Caller, seq: str) -> Any:
    state = request.app.state
    return json_response(await receipts.build(state.store, state.ledger_checkpoints, caller.user.id, params.seq_path(seq)))


# --- The fast path (http.fastpath) of the busiest routes ---------------------------


@agent.fast(read_log)
async def fast_read_log(scope: Scope, query: dict[str, str]) -> Answer | None:
    """``read_log`` with a plainly valid ``user`` and window."""
    window = params.plain_window(query, also=frozenset({"user"}))
    if window is None or not ids.is_uuid(query.get("user")):
        return None
    messages = await service.read(scope["app"].state.store, query["user"].lower(), window)
    return 200, _page(messages)


@agent.fast(send)
async def fast_send(scope: Scope, fields: dict[str, Any]) -> Answer | None:
    """``send`` with just a UUID ``userId`` and a non-empty ``text``."""
    user_id, text = fields.get("userId"), fields.get("text")
    if fields.keys() != {"userId", "text"} or not ids.is_uuid(user_id) or type(text) is not str or not text:
        return None
    message = await scope["app"].state.messages.send(user_id.lower(), text)
    return 201, jsontext.dumps(message.to_json())


@public.fast(read_own_log)
async def fast_read_own_log(scope: Scope, query: dict[str, str]) -> Answer | None:
    """``read_own_log`` with a plainly valid window, for an authenticated caller."""
    window = params.plain_window(query)
    if window is None:
        return None
    caller = await schemes.authenticated(Request(scope))
    return 200, _page(await service.read(scope["app"].state.store, caller.user.id, window))


@public.fast(receive)
async def fast_receive(scope: Scope, fields: dict[str, Any]) -> Answer | None:
    """``receive`` with just a non-empty ``text``, for an authenticated caller."""
    text = fields.get("text")
    if fields.keys() != {"text"} or type(text) is not str or not text:
        return None
    caller = await schemes.authenticated(Request(scope))
    message = await scope["app"].state.messages.receive(caller.user.id, text)
    return 201, jsontext.dumps(message.to_json())
