"""The wire shape of each record, as the spec's JSON has it: one definition for both sides of the kit boundary.

The agent kit (``agent_gateway.agent``) types what the Agent server answers
with these; the routes declare them as their responses (and so the
``/openapi.json`` schemas); the store's rows say, by ``to_json()``'s return
type, that they produce them. The kit runs inside the sandbox without the
server, so this module imports nothing of the gateway: only typing.
"""

from typing import Any

# typing_extensions' TypedDict, not typing's: before Python 3.12 pydantic refuses
# typing's (it builds the routes' OpenAPI schemas from these). It is typing's
# backport, which the kit has anyway (httpx needs it, through anyio).
from typing_extensions import TypedDict


class Message(TypedDict):
    id: str
    userId: str
    direction: str
    seq: int
    text: str
    createdAt: str


class MessageList(TypedDict):
    messages: list[Message]


class Decision(TypedDict):
    seq: int
    statement: str
    jws: str
    createdAt: str


class DecisionList(TypedDict):
    decisions: list[Decision]


class Schedule(TypedDict):
    name: str
    spec: dict[str, Any]
    data: Any
    until: str | None
    nextFireAt: str


class ScheduleList(TypedDict):
    schedules: list[Schedule]


class Signal(TypedDict):
    id: str
    kind: str
    payload: Any
    emittedAt: str
    state: str
    error: str | None


class SignalList(TypedDict):
    signals: list[Signal]


class Run(TypedDict):
    id: str
    signalId: str
    session: str | None
    prompt: str
    state: str
    error: str | None
    startedAt: str | None
    endedAt: str | None


class RunList(TypedDict):
    runs: list[Run]


class User(TypedDict):
    id: str
    attributes: Any
    createdAt: str


class UserList(TypedDict):
    users: list[User]


class Token(TypedDict):
    """A login's answer: the bearer Token, when it expires, and whose it is."""

    token: str
    expiresAt: str
    user: User
