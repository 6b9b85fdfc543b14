"""The Decision log: publish and read on the Agent server, read on the Public server (bearer)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.responses import Response
from starlette.types import Scope
from pydantic import BaseModel, ConfigDict, Field

from agent_gateway import jsontext, records
from agent_gateway.auth import schemes
from agent_gateway.decisions import service
from agent_gateway.http import params
from agent_gateway.http.app import router as new_router
from agent_gateway.http.fastpath import Answer
from agent_gateway.http.routing import error_responses, json_response
from agent_gateway.store.window import Window


class DecisionIn(BaseModel):
    model_config = ConfigDict(strict=True)

    statement: Annotated[str, Field(min_length=1)]


agent = new_router()
public = new_router()

_LIST = {200: {"model": records.DecisionList}}
_ONE = {200: {"model": records.Decision}, **error_responses(404)}
_LIST_SUMMARY = "Read a window of the Decision log, ascending by seq"
Authenticated = Annotated[schemes.Authenticated, Depends(schemes.authenticated)]


async def _read(request: Request, window: Window) -> Any:
    return Response(await service.page(request.app.state.store, window), media_type="application/json")


async def _get(request: Request, seq: str) -> Any:
    number = params.seq_path(seq)
    decision = await service.get(request.app.state.store, number)
    return json_response(decision.to_json())


@agent.post("/decisions", status_code=201, responses={201: {"model": records.Decision}}, summary="Publish a Decision")
async def publish(request: Request, body: DecisionIn) -> Any:
    decision = await request.app.state.publisher.publish(body.statement)
    return json_response(decision.to_json(), 201)


@agent.get("/decisions", responses=_LIST, summary=_LIST_SUMMARY)
async def read_agent(request: Request, window: Annotated[Window, Depends(params.cursor_window)]) -> Any:
    return await _read(request, window)


@agent.get("/decisions/{seq}", responses=_ONE, summary="Read one Decision")
async def get_agent(request: Request, seq: str) -> Any:
    return await _get(request, seq)


# Public reads: the same log for every User (no per-User filter), behind the bearer dependency.
@public.get("/decisions", responses={**_LIST, **error_responses(401)}, summary=_LIST_SUMMARY)
async def read_public(
    request: Request, _: Authenticated, window: Annotated[Window, Depends(params.cursor_window)]
) -> Any:
    return await _read(request, window)


@public.get("/decisions/{seq}", responses={**_ONE, **error_responses(401)}, summary="Read one Decision")
async def get_public(request: Request, _: Authenticated, seq: str) -> Any:
    return await _get(request, seq)


# --- The fast path (http.fastpath) of the busiest routes ---------------------------


@agent.fast(publish)
async def fast_publish(scope: Scope, fields: dict[str, Any]) -> Answer | None:
    """``publish`` with just a non-empty ``statement``."""
    statement = fields.get("statement")
    if fields.keys() != {"statement"} or type(statement) is not str or not statement:
        return None
    decision = await scope["app"].state.publisher.publish(statement)
    return 201, jsontext.dumps(decision.to_json())


@agent.fast(read_agent)
async def fast_read_agent(scope: Scope, query: dict[str, str]) -> Answer | None:
    """``read_agent`` with a plainly valid window."""
    window = params.plain_window(query)
    if window is None:
        return None
    return 200, await service.page(scope["app"].state.store, window)


@public.fast(read_public)
async def fast_read_public(scope: Scope, query: dict[str, str]) -> Answer | None:
    """``read_public`` with a plainly valid window, for an authenticated caller."""
    window = params.plain_window(query)
    if window is None:
        return None
    await schemes.authenticated(Request(scope))
    return 200, await service.page(scope["app"].state.store, window)
