"""Agent server: read-only views of Users."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from agent_gateway import ids, records
from agent_gateway.http import params
from agent_gateway.http.app import router as new_router
from agent_gateway.http.routing import error_responses, json_response
from agent_gateway.users import service


agent = new_router()


@agent.get("/users", responses={200: {"model": records.UserList}}, summary="List Users, newest first")
async def list_users(request: Request, limit: Annotated[int, Depends(params.list_limit)]) -> Any:
    async with request.app.state.store.read() as conn:
        users = await service.list_newest(conn, limit)
    return json_response({"users": [user.to_json() for user in users]})


@agent.get("/users/{id}", responses={200: {"model": records.User}, **error_responses(404)}, summary="Read one User")
async def get_user(request: Request, id: str) -> Any:
    user_id = ids.uuid("id", id)
    async with request.app.state.store.read() as conn:
        user = await service.get(conn, user_id)
    return json_response(user.to_json())
