"""Agent server: read-only views of Signals and Runs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Query, Request
from agent_gateway import errors, ids, records
from agent_gateway.http import params
from agent_gateway.http.app import router as new_router
from agent_gateway.http.routing import error_responses, json_response
from agent_gateway.signals import service


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
    async with request.app.state.store.read() as conn:
        signals = await service.list_signals(conn, limit, kind)
    return json_response({"signals": [signal.to_json() for signal in signals]})


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
    signal_id = ids.uuid("signalId", signal_id)
    async with request.app.state.store.read() as conn:
        runs = await service.list_runs(conn, limit, signal_id)
    return json_response({"runs": [run.to_json() for run in runs]})


@agent.get("/runs/{id}", responses={200: {"model": records.Run}, **error_responses(404)}, summary="Read one Run")
async def get_run(request: Request, id: str) -> Any:
    run_id = ids.uuid("id", id)
    async with request.app.state.store.read() as conn:
        run = await service.get_run(conn, run_id)
    return json_response(run.to_json())
