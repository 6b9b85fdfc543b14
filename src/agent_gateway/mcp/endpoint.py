"""``/mcp`` on the Agent server: the MCP Streamable HTTP transport of the gateway's tools.

Stateless, with JSON responses (the SDK's ``stateless`` and ``json_response``
modes): every POST carries its whole exchange and is answered in its own
response, so any HTTP process of a deployment (``http.workers``, several
``serve`` on PostgreSQL) answers any request, with nothing to share between
them, and no stream outlives its request. The tools need nothing more: none
sends a notification or asks the client anything. So GET (a stream for the
server's messages) and DELETE (ending a session) are 405, as MCP has it.

Each tool call is sent, in-process, to the Agent server's own routes (the
fast path in front of the FastAPI app; ``mcp.delivery``), so a tool answers
exactly what its route answers. The endpoint sits inside the Agent server's
app, so its body limit and connection limits hold here too; the strict query
rule is applied here: ``/mcp`` takes no query parameter.

The MCP SDK is loaded by the first request to ``/mcp``, not when the gateway starts:
importing it (its pydantic models) is about a third of a gateway's start, for an
endpoint many deployments never use.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import TYPE_CHECKING

from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gateway import errors
from agent_gateway.config import Settings
from agent_gateway.http import errors as http_errors
from agent_gateway.http.routing import check_query

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

PATH = "/mcp"
_POST_ONLY = "this MCP endpoint is stateless: it takes POST only (no session to end, no stream to open)"


class Endpoint:
    """The ASGI app at ``/mcp``; ``routes`` is the Agent server's app its tools call.

    ``stop`` after serving: the SDK's session manager, started by the first request, runs
    the per-request MCP servers in a task group of its own.
    """

    def __init__(self, routes: ASGIApp, settings: Settings) -> None:
        self._routes = routes
        self._settings = settings
        self.manager: StreamableHTTPSessionManager | None = None
        self._starting = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("query_string"):
            try:
                check_query(Request(scope), frozenset())
            except errors.InvalidInput as exc:
                await http_errors.response_for(exc)(scope, receive, send)
                return
        if scope["method"] != "POST":
            # Stateless: no session to end (DELETE) and no server-initiated message, so no
            # stream to open (GET; the SDK would hold one open, empty, as long as the client
            # waits). MCP's answer to both is 405.
            response = http_errors.error_response(405, _POST_ONLY, {"Allow": "POST"})
            await response(scope, receive, send)
            return
        # The body is read here, not by the SDK: a client that leaves before sending all of
        # it has nobody to answer, and the SDK would log that as an error with a traceback.
        try:
            body = await Request(scope, receive).body()
        except ClientDisconnect:
            return
        if self._stopping.is_set():  # stopped: no session manager to start again
            await http_errors.error_response(503, "the gateway is stopping")(scope, receive, send)
            return
        manager = self.manager or await self._start()
        await manager.handle_request(scope, _replaying(body, receive), send)

    async def _start(self) -> StreamableHTTPSessionManager:
        """Load the SDK (in a thread: the loop goes on serving meanwhile), build the session
        manager and run it until :meth:`stop`; once, whoever asks first."""
        async with self._starting:
            if self.manager is None:
                sessions = await asyncio.to_thread(importlib.import_module, "agent_gateway.mcp.sessions")
                manager = sessions.manager(self._routes, self._settings)
                await self._run(manager)
                self.manager = manager
        return self.manager

    async def _run(self, manager: StreamableHTTPSessionManager) -> None:
        started = asyncio.Event()

        async def run() -> None:
            async with manager.run():
                started.set()
                await self._stopping.wait()

        self._task = asyncio.create_task(run(), name="mcp endpoint")
        waiting = asyncio.create_task(started.wait())
        await asyncio.wait([self._task, waiting], return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if self._task.done():
            self._task.result()  # raises what stopped it

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """``receive`` with the request's ``body``, already read, handed out first."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
