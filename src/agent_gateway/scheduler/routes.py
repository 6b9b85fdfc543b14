"""Agent server: the ``/schedules`` routes (served unless ``scheduler.agent_routes`` is false)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Body, Depends, Request
from agent_gateway import records
from agent_gateway.http import params
from agent_gateway.http.app import router as new_router
from agent_gateway.http.routing import error_responses, json_response, no_content
from agent_gateway.scheduler import service
from agent_gateway.scheduler.spec import MAX_EXPR_CHARS


_INSTANT = {"type": "string", "description": "ISO 8601 instant with an offset (Z or ±hh:mm)"}
# Documentation only: the service checks the body itself, so that every
# definition failure is the one named error (spec: Errors 3).
PUT_BODY_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["spec"],
    "properties": {
        "spec": {
            "oneOf": [
                {
                    "type": "object",
                    "title": "once",
                    "additionalProperties": False,
                    "required": ["kind", "at"],
                    "properties": {"kind": {"const": "once"}, "at": {**_INSTANT, "description": "not in the past"}},
                },
                {
                    "type": "object",
                    "title": "cron",
                    "additionalProperties": False,
                    "required": ["kind", "expr"],
                    "properties": {
                        "kind": {"const": "cron"},
                        "expr": {
                            "type": "string",
                            "maxLength": MAX_EXPR_CHARS,
                            "description": "5 fields, 6 with seconds first, or @hourly/@daily/@weekly/@monthly/@yearly",
                        },
                        "tz": {"type": "string", "default": "UTC", "description": "IANA time zone"},
                    },
                },
            ],
        },
        "data": {"description": "any JSON, echoed in every fired Signal; null when omitted"},
        "until": {**_INSTANT, "description": "cron only: no fire after this instant"},
    },
}

agent = new_router()


@agent.get(
    "/schedules",
    responses={200: {"model": records.ScheduleList}},
    summary="List live Schedules, soonest first (ties by name)",
)
async def list_schedules(request: Request, limit: Annotated[int, Depends(params.list_limit)]) -> Any:
    async with request.app.state.store.read() as conn:
        schedules = await service.list_soonest(conn, limit)
    return json_response({"schedules": [schedule.to_json() for schedule in schedules]})


@agent.get(
    "/schedules/{name}",
    responses={200: {"model": records.Schedule}, **error_responses(404)},
    summary="Read one live Schedule",
)
async def get_schedule(request: Request, name: str) -> Any:
    async with request.app.state.store.read() as conn:
        schedule = await service.get(conn, name)
    return json_response(schedule.to_json())


@agent.put(
    "/schedules/{name}",
    responses={
        200: {"model": records.Schedule, "description": "Replaced"},
        201: {"model": records.Schedule, "description": "Created"},
    },
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": PUT_BODY_SCHEMA}}}},
    summary="Arm a Schedule (201) or replace the live one of that name (200)",
)
async def put_schedule(request: Request, name: str, body: Annotated[Any, Body()]) -> Any:
    async with request.app.state.store.transaction() as conn:
        schedule, created = await service.put_body(conn, name, body)
    return json_response(schedule.to_json(), 201 if created else 200)


@agent.delete(
    "/schedules/{name}",
    status_code=204,
    response_model=None,
    responses=error_responses(404),
    summary="Cancel a live Schedule: all its future fires stop",
)
async def delete_schedule(request: Request, name: str) -> Any:
    async with request.app.state.store.transaction() as conn:
        await service.delete(conn, name)
    return no_content()
