"""``GET /messages/stream`` on both servers: a User's log as Server-Sent Events (issue 13).

Where it starts: ``Last-Event-ID`` (what an EventSource sends when it
reconnects, to the same URL) wins over ``after``; with neither, the stream
holds only Messages committed after it opened. Every refusal comes before the
stream starts, as the spec's JSON error body.

The plainest requests are taken on the fast path (``http.fastpath``): behind
the FastAPI route, a stream would keep its request's layers (middleware,
dependencies, exit stacks: some thirty coroutines) alive as long as it lasts,
and thousands of streams are open at once.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Header, Query, Request
from starlette.types import Scope

from agent_gateway import errors, ids
from agent_gateway.auth import schemes
from agent_gateway.http.app import router as new_router
from agent_gateway.http.routing import error_responses, parse_int
from agent_gateway.store.window import MAX_CURSOR
from agent_gateway.streams.stream import MessageStream

PATH = "/messages/stream"
EVENTS = {
    "description": (
        "`text/event-stream`: each Message is one event, `id: <seq>`, `event: message`, "
        "`data: <the Message JSON>`; a `: keep-alive` comment line at least every "
        "`streams.keep_alive_ms`"
    ),
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}
AfterQuery = Annotated[
    str | None,
    Query(description=f"send every Message with seq > after first, then live ones (0..{MAX_CURSOR})"),
]
LastEventId = Annotated[
    str | None,
    Header(alias="Last-Event-ID", description=f"resume after this seq (0..{MAX_CURSOR}); wins over after"),
]


def _start(after: str | None, last_event_id: str | None) -> int | None:
    if last_event_id is not None:
        return parse_int("Last-Event-ID", last_event_id.strip(), 0, MAX_CURSOR)
    return parse_int("after", after, 0, MAX_CURSOR)


def _open(request: Request, user_id: str, after: int | None, **checks: Any) -> MessageStream:
    hub = request.app.state.streams
    if hub.closed:
        raise errors.Busy("the server is shutting down; reconnect")
    return MessageStream(hub, user_id, after, **checks)


agent = new_router()


@agent.get(
    PATH,
    response_class=MessageStream,
    status_code=200,
    responses={200: EVENTS, **error_responses(503)},
    summary="Follow a User's Message log as Server-Sent Events",
)
async def follow_log(
    request: Request,
    user: Annotated[str | None, Query(description="UUID of the User whose log is followed (required)")] = None,
    after: AfterQuery = None,
    last_event_id: LastEventId = None,
) -> Any:
    return _any_log(request, user, after, last_event_id)


def _any_log(request: Request, user: str | None, after: str | None, last_event_id: str | None) -> MessageStream:
    if user is None:
        raise errors.InvalidInput("user is required")
    user_id = ids.uuid("user", user)
    assert user_id is not None
    return _open(request, user_id, _start(after, last_event_id))


@agent.fast(follow_log)
async def fast_follow_log(scope: Scope, query: dict[str, str]) -> MessageStream | None:
    """The Agent server's stream on the fast path (module doc)."""
    if query.keys() - {"user", "after"}:
        return None
    request = Request(scope)
    return _any_log(request, query.get("user"), query.get("after"), request.headers.get("last-event-id"))


public = new_router()
Caller = Annotated[schemes.Authenticated, Depends(schemes.authenticated)]


@public.get(
    PATH,
    response_class=MessageStream,
    status_code=200,
    responses={200: EVENTS, **error_responses(401, 503)},
    summary="Follow your Message log as Server-Sent Events (ends when your Token does)",
)
async def follow_own_log(request: Request, caller: Caller, after: AfterQuery = None, last_event_id: LastEventId = None) -> Any:
    return _own_log(request, caller, _start(after, last_event_id))


@public.fast(follow_own_log)
async def fast_follow_own_log(scope: Scope, query: dict[str, str]) -> MessageStream | None:
    """The Public server's stream on the fast path (module doc)."""
    if query.keys() - {"after"}:
        return None
    request = Request(scope)
    caller = await schemes.authenticated(request)
    return _own_log(request, caller, _start(query.get("after"), request.headers.get("last-event-id")))


def _own_log(request: Request, caller: schemes.Authenticated, start: int | None) -> MessageStream:
    if caller.token_digest is not None:
        return _open(request, caller.user.id, start, token_digest=caller.token_digest)

    if caller.still_valid is not None:
        return _open(request, caller.user.id, start, still_allowed=caller.still_valid)

    async def still_allowed() -> bool:
        # The credentials it was opened with, asked again: revoked or expired ends the stream.
        try:
            again = await schemes.authenticated(request)
        except errors.AuthenticationFailed:
            return False
        return again.user.id == caller.user.id

    return _open(request, caller.user.id, start, still_allowed=still_allowed)
