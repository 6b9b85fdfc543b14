"""The Agent server's routes as MCP tools: one table, each tool one request to its route.

A tool call becomes the HTTP request its route takes (:meth:`Tool.request`),
sent by a ``mcp.delivery`` sender: over a real socket to a remote Agent
server (``agent-gateway mcp``, stdio), or in-process to the Agent server's own
ASGI app (``/mcp``). Either way the route itself answers, with every rule,
bound and message it has: the tool adds no second path to the services. What
the route answers becomes the tool's result: its JSON body as structured
content (``{}`` for a 204), or, for a refusal (400, 404, 503), a tool error
(``isError``) carrying the route's status and message.

Only what a route cannot be given is checked here: an argument the tool does
not take, a missing required one, and a path or query argument of the wrong
JSON type (a URL carries strings; turning ``true`` into ``"True"`` would be a
coercion the spec's routes never make).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import quote, urlencode

from mcp import types
from pydantic import TypeAdapter

from agent_gateway import errors, jsontext, records
from agent_gateway.decisions import routes as decisions_routes
from agent_gateway.http.fastpath import Route
from agent_gateway.mcp.delivery import RouteRequest, Sender, Unreachable
from agent_gateway.messages import routes as messages_routes
from agent_gateway.scheduler import routes as scheduler_routes
from agent_gateway.scheduler.routes import PUT_BODY_SCHEMA
from agent_gateway.signals import routes as signals_routes
from agent_gateway.signatures import routes as signatures_routes
from agent_gateway.signatures.routes import SignOut
from agent_gateway.signatures.service import MAX_TYP_LENGTH, STATEMENT_TYP
from agent_gateway.store import window as windows
from agent_gateway.users import routes as users_routes

UUID_PATTERN = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
SCHEDULE_NAME_PATTERN = "^[A-Za-z0-9._-]{1,128}$"

_LIMIT = {
    "type": "integer",
    "minimum": 1,
    "maximum": windows.MAX_LIMIT,
    "description": f"how many records at most, 1..{windows.MAX_LIMIT} (default {windows.DEFAULT_LIMIT}); "
    "a larger value is refused, not reduced",
}
_AFTER = {
    "type": "integer",
    "minimum": 0,
    "maximum": windows.MAX_CURSOR,
    "description": "walk forwards: records with seq strictly above this (0 reads from the beginning); "
    "set it to the largest seq received to poll for new ones",
}
_BEFORE = {
    "type": "integer",
    "minimum": 0,
    "maximum": windows.MAX_CURSOR,
    "description": "scroll back: the newest records with seq strictly below this; not with after",
}
_WINDOW_NOTE = (
    " Without after or before, the newest page. Always ascending by seq. A page as long as limit may "
    "have more; a shorter one is the end of that direction for now."
)


def _uuid(what: str) -> dict[str, Any]:
    return {"type": "string", "pattern": UUID_PATTERN, "description": what}


_SCHEDULE_NAME = {
    "type": "string",
    "pattern": SCHEDULE_NAME_PATTERN,
    "description": "the Schedule's name, its whole identity: 1..128 letters, digits, '.', '-', '_'; "
    "one namespace shared by the agent and the operator",
}
_EMPTY: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclasses.dataclass(frozen=True)
class Tool:
    """One MCP tool and the route request it makes.

    ``route`` is the method and path of the route it calls, taken from the route's own
    declaration (``http.app.Router.method_and_path``); the path names its path arguments
    in braces. ``query`` maps argument names to query parameter names; every other
    argument goes in the JSON body as given.
    """

    name: str
    title: str
    description: str
    route: Route
    properties: Mapping[str, Mapping[str, Any]]
    output: type[Any] | None  # a record (records.py) or a model; None: the route answers 204, the tool {}
    required: tuple[str, ...] = ()
    query: Mapping[str, str] = dataclasses.field(default_factory=dict)
    read_only: bool = True
    destructive: bool = False
    idempotent: bool = True

    @functools.cached_property
    def definition(self) -> types.Tool:
        """The MCP description of this tool: input schema with the spec's bounds, output schema.

        Made once per tool: pydantic's output schemas were three quarters of building a gateway
        (each test's in-process gateway built them all again)."""
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema={
                "type": "object",
                "properties": dict(self.properties),
                "required": list(self.required),
                "additionalProperties": False,
            },
            output_schema=_EMPTY if self.output is None else TypeAdapter(self.output).json_schema(),
            annotations=types.ToolAnnotations(
                title=self.title,
                read_only_hint=self.read_only,
                destructive_hint=self.destructive,
                idempotent_hint=self.idempotent,
                open_world_hint=False,
            ),
        )

    def request(self, arguments: Mapping[str, Any]) -> RouteRequest:
        """The route request for ``arguments``; raises :class:`ArgumentError` for what no route can be given."""
        for name in arguments:
            if name not in self.properties:
                raise ArgumentError(f"{self.name} takes no argument {name!r}")
        for name in self.required:
            if name not in arguments:
                raise ArgumentError(f"{name} is required")
        method, template = self.route
        path, raw_path, query, body = template, template, [], {}
        for name, value in arguments.items():
            if "{" + name + "}" in template:
                text = _url_text(name, value, self.properties[name])
                path = path.replace("{" + name + "}", text)
                raw_path = raw_path.replace("{" + name + "}", quote(text, safe=""))
            elif name in self.query:
                query.append((self.query[name], _url_text(name, value, self.properties[name])))
            else:
                body[name] = value
        content = jsontext.dumps(body) if method in ("POST", "PUT") else None
        return RouteRequest(method, path, raw_path, urlencode(query), content)


class ArgumentError(errors.GatewayError):
    """A call no route could be given: the tool answers it as an error, nothing is sent."""


def _url_text(name: str, value: Any, schema: Mapping[str, Any]) -> str:
    """A path or query argument as its URL text, when it has the JSON type the tool declares."""
    if schema.get("type") == "integer":
        if type(value) is not int:
            raise ArgumentError(f"{name} must be an integer")
        return str(value)
    if type(value) is not str:
        raise ArgumentError(f"{name} must be a string")
    return value


TOOLS: tuple[Tool, ...] = (
    Tool(
        name="send_message",
        title="Send a Message to a User",
        description=(
            "Send an outbound Message (agent to User) into one User's Message log; the User reads it on the "
            "Public server. Answers the stored Message with its seq, the next number in that User's log "
            "(one sequence for both directions). The Message is permanent: nothing edits or deletes it. "
            "Errors: 404 means no User has that id and nothing was stored; 503 means the Message was not "
            "recorded (a concurrent write to that User's log won the numbering race): sending it again is "
            "correct."
        ),
        route=messages_routes.agent.method_and_path(messages_routes.send),
        properties={
            "userId": _uuid("UUID of the User whose log receives the Message"),
            "text": {"type": "string", "minLength": 1, "description": "the Message, any non-empty text"},
        },
        required=("userId", "text"),
        output=records.Message,
        read_only=False,
        idempotent=False,
    ),
    Tool(
        name="read_messages",
        title="Read a User's Message log",
        description=(
            "Read a window of one User's Message log: inbound (User to agent) and outbound (agent to User) "
            "Messages interleaved, numbered by seq in that User's log." + _WINDOW_NOTE + " A well-formed id "
            "nobody holds reads as an empty log."
        ),
        route=messages_routes.agent.method_and_path(messages_routes.read_log),
        properties={"userId": _uuid("UUID of the User whose log is read"), "after": _AFTER, "before": _BEFORE, "limit": _LIMIT},
        required=("userId",),
        query={"userId": "user", "after": "after", "before": "before", "limit": "limit"},
        output=records.MessageList,
    ),
    Tool(
        name="publish_decision",
        title="Publish a Decision",
        description=(
            "Publish a Statement as a Decision: the gateway numbers it (seq, in one global log), timestamps "
            "it and signs it with the shared key, in one transaction, and answers the Decision with its "
            "compact JWS (typ service-decision+jws). A Decision is public and permanent: every User and "
            "anyone with the public key can read and verify it, and nothing retracts it. To sign without "
            "publishing, use sign_statement."
        ),
        route=decisions_routes.agent.method_and_path(decisions_routes.publish),
        properties={"statement": {"type": "string", "minLength": 1, "description": "what is decided, non-empty"}},
        required=("statement",),
        output=records.Decision,
        read_only=False,
        idempotent=False,
    ),
    Tool(
        name="read_decisions",
        title="Read the Decision log",
        description=(
            "Read a window of the one global Decision log; every reader sees the same records in the same "
            "order. Gaps in seq are expected and mean nothing." + _WINDOW_NOTE
        ),
        route=decisions_routes.agent.method_and_path(decisions_routes.read_agent),
        properties={"after": _AFTER, "before": _BEFORE, "limit": _LIMIT},
        query={"after": "after", "before": "before", "limit": "limit"},
        output=records.DecisionList,
    ),
    Tool(
        name="get_decision",
        title="Read one Decision",
        description="Read the Decision numbered seq. Error 404: no Decision has that number (not evidence of a withheld one).",
        route=decisions_routes.agent.method_and_path(decisions_routes.get_agent),
        properties={"seq": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1, "description": "the Decision's number"}},
        required=("seq",),
        output=records.Decision,
    ),
    Tool(
        name="sign_statement",
        title="Sign a Statement",
        description=(
            "Sign a Statement with the gateway's shared key and answer the compact JWS (payload {statement}, "
            "no number, no timestamp). A signed Statement is stored nowhere and numbered by nothing: keep "
            "the jws if it matters. Anyone can verify it against the public key."
        ),
        route=signatures_routes.agent.method_and_path(signatures_routes.sign),
        properties={
            "statement": {"type": "string", "minLength": 1, "description": "what to sign, non-empty"},
            "typ": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_TYP_LENGTH,
                "default": STATEMENT_TYP,
                "description": "the typ of the JWS protected header (the signer's own claim)",
            },
        },
        required=("statement",),
        output=SignOut,
        read_only=False,
    ),
    Tool(
        name="put_schedule",
        title="Arm or replace a Schedule",
        description=(
            "Arm the Schedule name, or replace the live one of that name. Each fire emits one Signal of kind "
            "service_schedule_fired whose payload carries scheduleName, scheduledFor, firedAt and your data; "
            "it wakes the agent in a later Run. spec is {kind: 'once', at} (an instant with an offset, not "
            "in the past) or {kind: 'cron', expr, tz?} (tz an IANA zone, default UTC); until (cron only) "
            "ends a cron. A missed fire is never replayed. Answers the Schedule with its nextFireAt. "
            "Error 400: an invalid definition (a once already past, a cron whose until is at or before its "
            "next occurrence, a bad expr or tz); nothing was stored."
        ),
        route=scheduler_routes.agent.method_and_path(scheduler_routes.put_schedule),
        properties={"name": _SCHEDULE_NAME, **PUT_BODY_SCHEMA["properties"]},
        required=("name", "spec"),
        output=records.Schedule,
        read_only=False,
        destructive=True,  # replaces a live Schedule of the same name
    ),
    Tool(
        name="get_schedule",
        title="Read one Schedule",
        description="Read the live Schedule name. Error 404: no live Schedule has that name (spent and cancelled ones are gone).",
        route=scheduler_routes.agent.method_and_path(scheduler_routes.get_schedule),
        properties={"name": _SCHEDULE_NAME},
        required=("name",),
        output=records.Schedule,
    ),
    Tool(
        name="delete_schedule",
        title="Cancel a Schedule",
        description=(
            "Cancel the live Schedule name: all its future fires stop. Answers {}. "
            "Error 404: no live Schedule has that name; nothing changed."
        ),
        route=scheduler_routes.agent.method_and_path(scheduler_routes.delete_schedule),
        properties={"name": _SCHEDULE_NAME},
        required=("name",),
        output=None,
        read_only=False,
        destructive=True,
        idempotent=False,  # a second cancel is a 404
    ),
    Tool(
        name="list_schedules",
        title="List Schedules",
        description="List the live Schedules, soonest nextFireAt first (ties by name); no cursor.",
        route=scheduler_routes.agent.method_and_path(scheduler_routes.list_schedules),
        properties={"limit": _LIMIT},
        query={"limit": "limit"},
        output=records.ScheduleList,
    ),
    Tool(
        name="get_user",
        title="Read one User",
        description=(
            "Read the User id: its id, createdAt and the attributes the operator set for it (grouping and "
            "authorization live there). Error 404: no User has that id."
        ),
        route=users_routes.agent.method_and_path(users_routes.get_user),
        properties={"id": _uuid("the User's id")},
        required=("id",),
        output=records.User,
    ),
    Tool(
        name="list_users",
        title="List Users",
        description="List Users, newest first; no cursor or search (Users past the limit are not reachable).",
        route=users_routes.agent.method_and_path(users_routes.list_users),
        properties={"limit": _LIMIT},
        query={"limit": "limit"},
        output=records.UserList,
    ),
    Tool(
        name="get_run",
        title="Read one Run",
        description=(
            "Read the Run id: the Prompt one Signal's Handler wrote, its Session, state (pending, running, "
            "done, failed), error and times. Error 404: no Run has that id."
        ),
        route=signals_routes.agent.method_and_path(signals_routes.get_run),
        properties={"id": _uuid("the Run's id")},
        required=("id",),
        output=records.Run,
    ),
    Tool(
        name="list_runs",
        title="List Runs",
        description="List Runs, newest first by startedAt (Runs not started yet first), optionally only those of one Signal; no cursor.",
        route=signals_routes.agent.method_and_path(signals_routes.list_runs),
        properties={"limit": _LIMIT, "signalId": _uuid("only the Runs of this Signal")},
        query={"limit": "limit", "signalId": "signalId"},
        output=records.RunList,
    ),
    Tool(
        name="get_signal",
        title="Read one Signal",
        description=(
            "Read the Signal id: its kind, payload (exactly as its producer wrote it), emittedAt, state "
            "(pending, processing, done, failed) and error. Error 404: no Signal has that id."
        ),
        route=signals_routes.agent.method_and_path(signals_routes.get_signal),
        properties={"id": _uuid("the Signal's id")},
        required=("id",),
        output=records.Signal,
    ),
    Tool(
        name="list_signals",
        title="List Signals",
        description="List Signals, newest first, optionally only those of one kind; no cursor.",
        route=signals_routes.agent.method_and_path(signals_routes.list_signals),
        properties={"limit": _LIMIT, "kind": {"type": "string", "description": "only Signals of this kind"}},
        query={"limit": "limit", "kind": "kind"},
        output=records.SignalList,
    ),
)

SCHEDULE_TOOLS = frozenset({"put_schedule", "get_schedule", "delete_schedule", "list_schedules"})


def available(*, schedules: bool = True) -> dict[str, Tool]:
    """The tools by name; without the Schedule tools when the Agent server has no Schedule routes."""
    return {tool.name: tool for tool in TOOLS if schedules or tool.name not in SCHEDULE_TOOLS}


async def call(send: Sender, tool: Tool, arguments: Mapping[str, Any]) -> types.CallToolResult:
    """Call ``tool``'s route with ``arguments`` and answer what it answered, as an MCP tool result."""
    try:
        request = tool.request(arguments)
    except ArgumentError as exc:
        return _error(f"400 Bad Request: {exc}")
    try:
        status, content = await send(request)
    except Unreachable as exc:
        return _error(str(exc))
    if 200 <= status < 300:
        body = jsontext.loads(content) if content else {}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=content.decode() if content else "{}")],
            structured_content=body,
        )
    return _error(refusal(status, content))


def refusal(status: int, content: bytes) -> str:
    """``status error: message`` from the route's error body (or what a proxy in between said)."""
    try:
        body = jsontext.loads(content)
        return f"{body['statusCode']} {body['error']}: {body['message']}"
    except (ValueError, KeyError, TypeError):
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
        return f"{status} {phrase}: {content[:500].decode(errors='replace')}"


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
