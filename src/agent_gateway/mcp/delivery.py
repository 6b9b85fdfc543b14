"""How a tool's request reaches its route: over HTTP (stdio), or in-process to the Agent server's app (``/mcp``).

A sender takes a :class:`RouteRequest` and answers the route's status and
body bytes. In-process, the request is handed to the Agent server's ASGI app
(its fast path, then FastAPI) as uvicorn would hand it, and the response
messages are collected: the same route code as over a socket, without one.
``httpx.ASGITransport`` does the same but costs about 2 ms a call on top
(it builds a whole ``httpx`` request and response, and tries to import
``sniffio`` on every request, which fails here), as much as the route's own work.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

import httpx
from starlette.types import ASGIApp, Message

from agent_gateway import errors
from agent_gateway.http import errors as http_errors


@dataclasses.dataclass(frozen=True)
class RouteRequest:
    """One request to a route of the Agent server."""

    method: str
    path: str  # as the route reads it
    raw_path: str  # percent-encoded, as it travels
    query: str  # URL-encoded, "" for none
    body: bytes | None  # JSON


# Sends a request to its route and answers (status, body).
Sender = Callable[[RouteRequest], Awaitable[tuple[int, bytes]]]


class Unreachable(errors.GatewayError):
    """The Agent server did not answer (over HTTP): nothing was done."""


def over_http(http: httpx.AsyncClient) -> Sender:
    """A sender of requests to the Agent server at ``http``'s base URL."""

    async def send(request: RouteRequest) -> tuple[int, bytes]:
        headers = {"content-type": "application/json"} if request.body is not None else None
        target = request.raw_path + (f"?{request.query}" if request.query else "")
        try:
            response = await http.request(request.method, target, content=request.body, headers=headers)
        except httpx.HTTPError as exc:
            raise Unreachable(
                f"the Agent server at {http.base_url} did not answer: {exc or type(exc).__name__}; nothing was done"
            ) from None
        return response.status_code, response.content

    return send


def in_process(app: ASGIApp) -> Sender:
    """A sender of requests to ``app``, the Agent server's ASGI app, in this process."""

    async def send(request: RouteRequest) -> tuple[int, bytes]:
        headers = [(b"host", b"agent-server")]
        if request.body is not None:
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(request.body)).encode())]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": "http",
            "path": request.path,
            "raw_path": request.raw_path.encode(),
            "query_string": request.query.encode(),
            "root_path": "",
            "headers": headers,
            "client": None,
            "server": None,
            "state": {},
        }
        answered = asyncio.Event()
        body_sent = False
        status, chunks = 500, []

        async def receive() -> Message:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": request.body or b"", "more_body": False}
            await answered.wait()  # as a client that stays until the response is complete
            return {"type": "http.disconnect"}

        async def respond(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    answered.set()

        try:
            await app(scope, receive, respond)
        except Exception as exc:
            # Starlette re-raises a bug after answering its 500; before an answer, this one.
            if not answered.is_set():
                return 500, http_errors.response_for(exc).body
        finally:
            answered.set()
        return status, b"".join(chunks)

    return send
