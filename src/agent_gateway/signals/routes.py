"""Agent server: read-only views of Signals and Runs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Query, Request
from starlette.types import Scope

from agent_gateway import errors, ids, jsontext, records
from agent_gateway.http import params
from agent_gateway.http.app import router as new_router
from agent_gateway.http.fastpath import Answer
from agent_gateway.http.routing import error_responses, json_response
from agent_gateway.signals import service
from agent_gateway.store.engine import Store

agent = new_router()

Limit = Annotated[int, Depends(params.list_limit)]


@agent.get("/signals", responses={200: {"model": records.SignalList}}, summary="List Signals, newest first")
async def list_signals(
    request: Request,
    limit: Limit,
    kind: Annotated[str | None, Query(description="only Signals of this kind")] = None,
) -> Any:
    if kind is not None and "\x00" in kind:
        raise errors.InvalidInput("kind must not contain NUL characters")
    return json_response(await _signals(request.app.state.store, limit, kind))


async def _signals(store: Store, limit: int, kind: str | None) -> dict[str, Any]:
    return {"signals": [signal.to_json() for signal in await service.recent_signals(store, limit, kind)]}


@agent.get(
    "/signals/{id}", responses={200: {"model": records.Signal}, **error_responses(404)}, summary="Read one Signal"
)
async def get_signal(request: Request, id: str) -> Any:
    signal_id = ids.uuid("id", id)
    async with request.app.state.store.read() as conn:
        signal = await service.get_signal(conn, signal_id)
    return json_response(signal.to_json())


@agent.get(
    "/runs",
    responses={200: {"model": records.RunList}},
    summary="List Runs, newest first by startedAt (Runs not started yet first)",
)
async def list_runs(
    request: Request,
    limit: Limit,
    signal_id: Annotated[str | None, Query(alias="signalId", description="only the Runs of this Signal")] = None,
) -> Any:
    return json_response(await _runs(request.app.state.store, limit, ids.uuid("signalId", signal_id)))


async def _runs(store: Store, limit: int, signal_id: str | None) -> dict[str, Any]:
    return {"runs": [run.to_json() for run in await service.recent_runs(store, limit, signal_id)]}


@agent.get("/runs/{id}", responses={200: {"model": records.Run}, **error_responses(404)}, summary="Read one Run")
async def get_run(request: Request, id: str) -> Any:
    run_id = ids.uuid("id", id)
    async with request.app.state.store.read() as conn:
        run = await service.get_run(conn, run_id)
    return json_response(run.to_json())


# --- The fast path (http.fastpath) of the routes agents poll ----------------------


@agent.fast(list_signals)
async def fast_list_signals(scope: Scope, query: dict[str, str]) -> Answer | None:
    """``list_signals`` with a plainly valid ``limit`` and ``kind``."""
    limit, kind = params.plain_limit(query, also=frozenset({"kind"})), query.get("kind")
    if limit is None or (kind is not None and "\x00" in kind):
        return None
    return 200, jsontext.dumps(await _signals(scope["app"].state.store, limit, kind))


@agent.fast(list_runs)
async def fast_list_runs(scope: Scope, query: dict[str, str]) -> Answer | None:
    """``list_runs`` with a plainly valid ``limit`` and ``signalId``."""
    limit, signal_id = params.plain_limit(query, also=frozenset({"signalId"})), query.get("signalId")
    if limit is None or (signal_id is not None and not ids.is_uuid(signal_id)):
        return None
    return 200, jsontext.dumps(await _runs(scope["app"].state.store, limit, signal_id and signal_id.lower()))
