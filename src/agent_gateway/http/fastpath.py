"""The busiest routes, answered straight from the ASGI messages when the request is plainly valid.

FastAPI's routing, middleware, dependency solving and body models cost more
than the whole work of a hot route (a signature, a page of a log, a row
appended by group commit). :class:`FastPath` sits in front of an app and
gives a request for one of its routes to that route's fast handler when the
request is of the plainest kind: a POST with ``Content-Type:
application/json``, a ``Content-Length`` within the body limit and a body
that is a JSON object; a GET with no parameter given twice. The handler
decides the rest: it answers ``None``, before doing anything, for a request
it does not take, and the request goes on, with its body, to the FastAPI
route, which applies every rule and words every refusal. So the fast path
only ever answers what the route would have answered, for the requests that
matter, and never needs a refusal of its own.

A route may have one path parameter segment (``/decisions/{seq}/proof``):
its handler finds the segment, as it came, in ``scope["path_params"]``, and
an answer of the fast path leaves the route in ``scope["route"]``, as
FastAPI's routing does, so the request is counted under its template
(``ops.observe``). Such routes are looked for only when no exact path is a
fast route, so the busiest lookups stay one dict probe.

A fast handler is declared beside its route, in the area's ``routes.py``, with
``@router.fast(endpoint)`` (``http.app.Router``), which takes the method and
path from the route; the gateway collects the handlers of the routers each
server includes (``http.app.fast_routes``).

An error the handler raises once it has begun (an unknown Token, a User
nobody holds, the database gone) is answered as the route answers it
(``http.errors.response_for``): the work is not tried a second time.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway.http import errors as http_errors

# The scope key of the body the fast path read (its handlers' Requests have no receive channel).
BODY = "agent_gateway.body"
# (status, JSON body) of an answer.
Answer = tuple[int, bytes]
# A route's method and path (its template), as declared on its router.
Route = tuple[str, str]
# A route's fast handler: the request's scope and its JSON object (POST) or query
# parameters (GET); None hands the request to the route. A handler may also answer
# with a response to run (a Message stream: FastAPI's layers would live as long as it).
Handler = Callable[[Scope, dict[str, Any]], Awaitable["Answer | ASGIApp | None"]]


@dataclasses.dataclass(frozen=True)
class Template:
    """A fast route with one path parameter segment: its path is ``prefix``, the segment, ``suffix``."""

    method: str
    path_format: str  # what ops.observe labels the request with, as FastAPI's routes
    prefix: str
    name: str
    suffix: str
    handler: Handler

    @classmethod
    def parse(cls, method: str, path: str, handler: Handler) -> Template | None:
        """The template of ``path``; None for a path without parameter."""
        opening = path.find("{")
        if opening < 0:
            return None
        closing = path.index("}", opening)
        prefix, name, suffix = path[:opening], path[opening + 1 : closing], path[closing + 1 :]
        if not prefix.endswith("/") or not (suffix == "" or suffix.startswith("/")) or "{" in suffix:
            raise ValueError(f"a fast route has at most one path parameter, a whole segment: {path}")
        return cls(method, path, prefix, name, suffix, handler)

    def segment(self, scope: Scope) -> str | None:
        """The parameter's segment of the request's path; None when the path is not this route's."""
        path = scope["path"]
        if scope["method"] != self.method or not path.startswith(self.prefix) or not path.endswith(self.suffix):
            return None
        segment = path[len(self.prefix) : len(path) - len(self.suffix)]
        return segment if segment and "/" not in segment else None


class FastPath:
    """Answers the plainly valid requests of ``routes`` ((method, path) -> handler) itself.

    It is the outermost ASGI app of a server: the layers of FastAPI and
    Starlette in front of the routes cost a fast request as much again.
    Handlers find the FastAPI app in ``scope["app"]``, as routes do.
    """

    def __init__(self, app: ASGIApp, limit: int, routes: Mapping[Route, Handler]) -> None:
        self.app = app
        self.limit = limit
        self.routes: dict[Route, Handler] = {}
        self.templates: list[Template] = []
        for (method, path), handler in routes.items():
            template = Template.parse(method, path, handler)
            if template is None:
                self.routes[method, path] = handler
            else:
                self.templates.append(template)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        handler = self.routes.get((scope["method"], scope["path"]))
        template = None
        if handler is None:
            template = self._template(scope)
            if template is None:
                await self.app(scope, receive, send)
                return
            handler = template.handler
        body = b""
        if scope["method"] == "POST":
            if not self._plain_post(scope):
                await self.app(scope, receive, send)
                return
            chunks = []
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            body = b"".join(chunks)
        data = _data(scope, body)
        answer = None
        if data is not None:
            scope["app"] = self.app
            # The handler's Request has no receive channel: a scheme signing the body (NIP-98) reads it here.
            scope[BODY] = body
            try:
                answer = await handler(scope, data)
            except Exception as exc:
                if template is not None:
                    scope["route"] = template
                await http_errors.response_for(exc)(scope, receive, send)
                return
        if answer is None:
            await self.app(scope, _replay(body, receive) if scope["method"] == "POST" else receive, send)
            return
        if template is not None:
            scope["route"] = template
        if not isinstance(answer, tuple):
            await answer(scope, receive, send)
            return
        status, content = answer
        headers = [(b"content-length", str(len(content)).encode()), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    def _template(self, scope: Scope) -> Template | None:
        """The templated route of the request, its segment put in ``scope["path_params"]``."""
        for template in self.templates:
            segment = template.segment(scope)
            if segment is not None:
                scope["path_params"] = {template.name: segment}
                return template
        return None

    def _plain_post(self, scope: Scope) -> bool:
        length = content_type = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"content-type":
                content_type = value
        return content_type == b"application/json" and length is not None and length.isdigit() and int(length) <= self.limit


def _data(scope: Scope, body: bytes) -> dict[str, Any] | None:
    """The JSON object of a POST or the query parameters of a GET; None when not that plain."""
    if scope["method"] == "POST":
        if scope["query_string"]:
            return None
        try:
            fields = orjson.loads(body)  # refuses what the route's strict parser refuses
        except orjson.JSONDecodeError:
            return None
        return fields if type(fields) is dict else None
    try:
        pairs = urllib.parse.parse_qsl(scope["query_string"].decode("ascii"), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        return None if scope["query_string"] else {}
    query = dict(pairs)
    return query if len(query) == len(pairs) else None


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with ``body``, already read, given back first."""
    replayed = False

    async def receive_again() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive_again
