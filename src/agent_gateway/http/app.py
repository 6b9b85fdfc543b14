"""The two ASGI apps: each a FastAPI instance with the shared conventions installed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway import errors
from agent_gateway.http import errors as http_errors
from agent_gateway.http.routing import StrictRoute, json_response


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with 413, by Content-Length or by counting."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > self.limit):
                response = http_errors.error_response(413, f"request body is over {self.limit} bytes")
                await response(scope, receive, send)
                return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise errors.PayloadTooLarge(f"request body is over {self.limit} bytes")
            return message

        await self.app(scope, counting_receive, send)


def router() -> APIRouter:
    """A router whose routes follow the spec's cross-cutting rules."""
    return APIRouter(route_class=StrictRoute)


def create_app(title: str, description: str, routers: Iterable[APIRouter], max_body_bytes: int) -> FastAPI:
    app = FastAPI(
        title=title,
        description=description,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        # A redirect would answer a path no route has with a Location built from the
        # client's Host header; such paths are 404 like any other.
        redirect_slashes=False,
    )
    for included in routers:
        app.include_router(included)
    http_errors.install(app)

    schema: dict[str, Any] = {}

    def openapi_json() -> Any:
        if not schema:
            schema.update(_without_422(app.openapi()))
        return json_response(schema)

    meta = router()
    meta.add_api_route("/openapi.json", openapi_json, methods=["GET"], include_in_schema=False)
    app.include_router(meta)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    return app


def _without_422(schema: dict[str, Any]) -> dict[str, Any]:
    """FastAPI documents a 422 this service never sends (validation failures are 400)."""
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            operation.get("responses", {}).pop("422", None)
    components = schema.get("components", {}).get("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    return schema
