"""The two ASGI apps: each a FastAPI instance with the shared conventions installed.

Their routes are declared on :class:`Router`s (``router()``), which also carry
the fast twins of their busiest routes (``http.fastpath``): a twin is attached
to its route with ``@router.fast(endpoint)``, so the method and path are typed
once, in the route's decorator, and the gateway collects the twins of the
routers it includes (``fast_routes``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway import errors
from agent_gateway.http import errors as http_errors
from agent_gateway.http.fastpath import Handler, Route
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


class Router(APIRouter):
    """A router whose routes follow the spec's cross-cutting rules, and may have fast twins."""

    def __init__(self) -> None:
        super().__init__(route_class=StrictRoute)
        # The fast twins attached with ``fast``, by their route's method and path.
        self.fast_routes: dict[Route, Handler] = {}

    def method_and_path(self, endpoint: Callable[..., Any]) -> Route:
        """The method and path of the one route of this router that ``endpoint`` answers."""
        routes = [route for route in self.routes if isinstance(route, APIRoute) and route.endpoint is endpoint]
        if len(routes) != 1:
            raise ValueError(f"{endpoint.__qualname__} is not the endpoint of one route of this router")
        route = routes[0]
        if len(route.methods) != 1:
            raise ValueError(f"the route of {endpoint.__qualname__} has more than one method")
        (method,) = route.methods
        return method, route.path

    def fast(self, endpoint: Callable[..., Any]) -> Callable[[Handler], Handler]:
        """Attach the decorated handler as the fast twin of ``endpoint``'s route (declared above it)."""
        route = self.method_and_path(endpoint)
        if route in self.fast_routes:
            raise ValueError(f"{' '.join(route)} already has a fast twin")

        def attach(handler: Handler) -> Handler:
            self.fast_routes[route] = handler
            return handler

        return attach


def router() -> Router:
    """A router whose routes follow the spec's cross-cutting rules."""
    return Router()


def fast_routes(routers: Iterable[Router]) -> dict[Route, Handler]:
    """The fast twins of ``routers``, the routers of one server: a route of a server has one twin at most."""
    collected: dict[Route, Handler] = {}
    for included in routers:
        for route, handler in included.fast_routes.items():
            if route in collected:
                raise ValueError(f"{' '.join(route)} has a fast twin on two routers of one server")
            collected[route] = handler
    return collected


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
