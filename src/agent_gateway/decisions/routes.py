"""The Decision log: publish and read on the Agent server, read on the Public server (bearer)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from agent_gateway.auth import schemes
from agent_gateway.decisions import service
from agent_gateway.http import params
from agent_gateway.http.app import router as new_router
from agent_gateway.http.routing import error_responses, json_response
from agent_gateway.store.window import Window


class DecisionIn(BaseModel):
    model_config = ConfigDict(strict=True)

    statement: Annotated[str, Field(min_length=1)]


class DecisionOut(BaseModel):
    seq: int
    statement: str
    jws: str
    createdAt: str


class DecisionList(BaseModel):
    decisions: list[DecisionOut]


agent = new_router()
public = new_router()

_LIST = {200: {"model": DecisionList}}
_ONE = {200: {"model": DecisionOut}, **error_responses(404)}
_LIST_SUMMARY = "Read a window of the Decision log, ascending by seq"
Authenticated = Annotated[schemes.Authenticated, Depends(schemes.authenticated)]


async def _read(request: Request, window: Window) -> Any:
    decisions = await service.read(request.app.state.store, window)
    return json_response({"decisions": [decision.to_json() for decision in decisions]})


async def _get(request: Request, seq: str) -> Any:
    number = params.seq_path(seq)
    decision = await service.get(request.app.state.store, number)
    return json_response(decision.to_json())


@agent.post("/decisions", status_code=201, responses={201: {"model": DecisionOut}}, summary="Publish a Decision")
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
