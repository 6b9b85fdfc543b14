"""The Run ledger, on both servers (the Public server's behind the bearer, as the Decision log's):
GET /ledger/checkpoint, GET /ledger/checkpoint/witnessed, GET /ledger/checkpoint/consistency,
GET /ledger/entries, GET /ledger/entries/{seq}."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from pydantic import BaseModel
from starlette.responses import Response

from agent_gateway import jsontext, merkle
from agent_gateway.auth import schemes
from agent_gateway.http import params
from agent_gateway.http.app import router as new_router
from agent_gateway.http.routing import error_responses, json_response
from agent_gateway.ledger import service
from agent_gateway.ledger.receipt import EntryOut, ProvedEntry, entry_out, proved
from agent_gateway.store.window import Window
from agent_gateway.transparency import routes as transparency_routes
from agent_gateway.transparency import service as transparency


class EntryList(BaseModel):
    entries: list[EntryOut]


agent = new_router()
public = new_router()
Authenticated = Annotated[schemes.Authenticated, Depends(schemes.authenticated)]

_CHECKPOINT = {
    200: {
        "content": {"text/plain": {"schema": {"type": "string"}}},
        "description": "A C2SP tlog-checkpoint of the Run ledger signed as a C2SP signed note by the gateway's key",
    }
}
_CHECKPOINT_SUMMARY = "The signed checkpoint of the Run ledger's Merkle tree"
_WITNESSED = transparency_routes.WITNESSED
_WITNESSED_SUMMARY = "The newest checkpoint of the Run ledger cosigned by a quorum of the witnesses"
_CONSISTENCY = {200: {"model": transparency_routes.ConsistencyOut}}
_CONSISTENCY_SUMMARY = "The consistency proof between two sizes of the Run ledger's tree"
_LIST = {200: {"model": EntryList}}
_LIST_SUMMARY = "Read a window of the Run ledger, ascending by seq"
_ONE = {200: {"model": ProvedEntry}, **error_responses(404)}
_ONE_SUMMARY = "Read one entry of the Run ledger, with its inclusion proof"


async def _checkpoint(request: Request) -> Response:
    return Response(
        await request.app.state.ledger_checkpoints.latest(), media_type=transparency_routes.CHECKPOINT_MEDIA_TYPE
    )


async def _witnessed(request: Request) -> Response:
    _, signed = await request.app.state.ledger_witnessed.latest()
    return Response(signed, media_type=transparency_routes.CHECKPOINT_MEDIA_TYPE)


async def _consistency(request: Request, from_: str | None, to: str | None) -> Any:
    old, new = transparency_routes.consistency_args(from_, to)
    new, hashes = await transparency.consistency(request.app.state.store, old, new, service.LOG)
    return json_response({"from": old, "to": new, "hashes": merkle.b64(hashes)})


async def _read(request: Request, window: Window) -> Any:
    entries = await service.read(request.app.state.store, window)
    return Response(jsontext.dumps({"entries": [entry_out(e) for e in entries]}), media_type="application/json")


async def _get(request: Request, seq: str) -> Any:
    number = params.seq_path(seq)
    store = request.app.state.store
    return json_response(await proved(store, await service.get(store, number), None))


@agent.get("/ledger/checkpoint", response_class=Response, responses=_CHECKPOINT, summary=_CHECKPOINT_SUMMARY)
async def checkpoint_agent(request: Request) -> Any:
    return await _checkpoint(request)


@agent.get("/ledger/checkpoint/witnessed", response_class=Response, responses=_WITNESSED, summary=_WITNESSED_SUMMARY)
async def witnessed_agent(request: Request) -> Any:
    return await _witnessed(request)


@agent.get("/ledger/checkpoint/consistency", responses=_CONSISTENCY, summary=_CONSISTENCY_SUMMARY)
async def consistency_agent(
    request: Request, from_: transparency_routes.FromQuery = None, to: transparency_routes.ToQuery = None
) -> Any:
    return await _consistency(request, from_, to)


@agent.get("/ledger/entries", responses=_LIST, summary=_LIST_SUMMARY)
async def read_agent(request: Request, window: Annotated[Window, Depends(params.cursor_window)]) -> Any:
    return await _read(request, window)


@agent.get("/ledger/entries/{seq}", responses=_ONE, summary=_ONE_SUMMARY)
async def get_agent(request: Request, seq: str) -> Any:
    return await _get(request, seq)


@public.get(
    "/ledger/checkpoint", response_class=Response, responses={**_CHECKPOINT, **error_responses(401)},
    summary=_CHECKPOINT_SUMMARY,
)
async def checkpoint_public(request: Request, _: Authenticated) -> Any:
    return await _checkpoint(request)


@public.get(
    "/ledger/checkpoint/witnessed", response_class=Response, responses={**_WITNESSED, **error_responses(401)},
    summary=_WITNESSED_SUMMARY,
)
async def witnessed_public(request: Request, _: Authenticated) -> Any:
    return await _witnessed(request)


@public.get(
    "/ledger/checkpoint/consistency", responses={**_CONSISTENCY, **error_responses(401)}, summary=_CONSISTENCY_SUMMARY
)
async def consistency_public(
    request: Request, _: Authenticated, from_: transparency_routes.FromQuery = None,
    to: transparency_routes.ToQuery = None,
) -> Any:
    return await _consistency(request, from_, to)


@public.get("/ledger/entries", responses={**_LIST, **error_responses(401)}, summary=_LIST_SUMMARY)
async def read_public(
    request: Request, _: Authenticated, window: Annotated[Window, Depends(params.cursor_window)]
) -> Any:
    return await _read(request, window)


@public.get("/ledger/entries/{seq}", responses={**_ONE, **error_responses(401)}, summary=_ONE_SUMMARY)
async def get_public(request: Request, _: Authenticated, seq: str) -> Any:
    return await _get(request, seq)
