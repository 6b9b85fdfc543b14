"""Typed clients of the Agent server, sync (:class:`Client`) and async (:class:`AsyncClient`).

Each operation is described once (a :class:`_Call`: method, path, query,
body, and what a success answers); the two clients only differ in how they
send it. Every refusal, and a server that cannot be reached, raises
:class:`AgentError` carrying the spec's error body. What a call answers is
typed by the record shapes the routes themselves declare
(:mod:`agent_gateway.records`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from agent_gateway.records import Decision, Message, Schedule, Signal, User
# A Run record is a RunRecord here: in the kit ``Run`` names the Run handed to
# ``handle`` (serve.py), which every agent program imports by that name.
from agent_gateway.records import Run as RunRecord

URL_ENV = "AGENT_SERVER_URL"
TIMEOUT_S = 30.0

T = TypeVar("T")


# Not an errors.GatewayError: the kit stays on its side of the boundary (it imports
# records.py alone), and this is an answer a client received, with its own status.
class AgentError(Exception):
    """The Agent server refused a call (``status_code``, ``error``, ``message``: the spec's error body), or could not be reached (``status_code`` None)."""

    def __init__(self, status_code: int | None, error: str, message: str) -> None:
        super().__init__(f"{status_code} {error}: {message}" if status_code is not None else f"{error}: {message}")
        self.status_code = status_code
        self.error = error
        self.message = message

    @property
    def body(self) -> dict[str, Any]:
        return {"statusCode": self.status_code, "error": self.error, "message": self.message}


@dataclasses.dataclass(frozen=True)
class _Call(Generic[T]):
    method: str
    path: str
    expect: tuple[int, ...]
    result: Callable[[Any], T]
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    body: Any = None

    def request(self, client: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        params = {name: value for name, value in self.params.items() if value is not None}
        kwargs: dict[str, Any] = {"params": params} if params else {}
        if self.body is not None:
            kwargs["json"] = self.body
        return client.build_request(self.method, self.path, **kwargs)

    def outcome(self, response: httpx.Response) -> T:
        if response.status_code not in self.expect:
            raise _refusal(response)
        return self.result(response.json() if response.content else None)


def _refusal(response: httpx.Response) -> AgentError:
    try:
        body = response.json()
        return AgentError(int(body["statusCode"]), str(body["error"]), str(body["message"]))
    except (ValueError, KeyError, TypeError):  # not the spec's body (a proxy in between, say)
        return AgentError(response.status_code, response.reason_phrase, response.text[:500])


def _unreachable(url: str, exc: httpx.HTTPError) -> AgentError:
    return AgentError(None, "Unreachable", f"the Agent server at {url} did not answer: {exc or type(exc).__name__}")


def _member(name: str) -> Callable[[Any], Any]:
    return lambda body: body[name]


def _same(body: Any) -> Any:
    return body


def _none(body: Any) -> None:
    return None


def _segment(value: str) -> str:
    return quote(value, safe="")


# --- the operations ---------------------------------------------------------------


def send_message(user_id: str, text: str) -> _Call[Message]:
    return _Call("POST", "/messages", (201,), _same, body={"userId": user_id, "text": text})


def read_messages(user: str, after: int | None, before: int | None, limit: int | None) -> _Call[list[Message]]:
    params = {"user": user, "after": after, "before": before, "limit": limit}
    return _Call("GET", "/messages", (200,), _member("messages"), params=params)


def publish(statement: str) -> _Call[Decision]:
    return _Call("POST", "/decisions", (201,), _same, body={"statement": statement})


def sign(statement: str, typ: str | None) -> _Call[str]:
    body = {"statement": statement} if typ is None else {"statement": statement, "typ": typ}
    return _Call("POST", "/sign", (200,), _member("jws"), body=body)


def set_schedule(name: str, spec: dict[str, Any], data: Any, until: str | None) -> _Call[Schedule]:
    body: dict[str, Any] = {"spec": spec}
    if data is not None:
        body["data"] = data
    if until is not None:
        body["until"] = until
    # 201 for a new name, 200 for a replaced one: both answer the Schedule.
    return _Call("PUT", f"/schedules/{_segment(name)}", (200, 201), _same, body=body)


def cancel_schedule(name: str) -> _Call[None]:
    return _Call("DELETE", f"/schedules/{_segment(name)}", (204,), _none)


def signals(kind: str | None, limit: int | None) -> _Call[list[Signal]]:
    return _Call("GET", "/signals", (200,), _member("signals"), params={"kind": kind, "limit": limit})


def runs(signal_id: str | None, limit: int | None) -> _Call[list[RunRecord]]:
    return _Call("GET", "/runs", (200,), _member("runs"), params={"signalId": signal_id, "limit": limit})


def run(run_id: str) -> _Call[RunRecord]:
    return _Call("GET", f"/runs/{_segment(run_id)}", (200,), _same)


def user(user_id: str) -> _Call[User]:
    return _Call("GET", f"/users/{_segment(user_id)}", (200,), _same)


def _base_url(url: str | None) -> str:
    url = url or os.environ.get(URL_ENV)
    if not url:
        raise AgentError(None, "Unconfigured", f"no Agent server URL: pass one or set ${URL_ENV}")
    return url.rstrip("/")


class Client:
    """The Agent server at ``url`` (default ``$AGENT_SERVER_URL``), called synchronously."""

    def __init__(self, url: str | None = None, *, timeout: float = TIMEOUT_S) -> None:
        self.url = _base_url(url)
        self._http = httpx.Client(base_url=self.url, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _do(self, call: _Call[T]) -> T:
        try:
            response = self._http.send(call.request(self._http))
        except httpx.HTTPError as exc:
            raise _unreachable(self.url, exc) from None
        return call.outcome(response)

    def send_message(self, user_id: str, text: str) -> Message:
        """Post an outbound Message to a User."""
        return self._do(send_message(user_id, text))

    def read_messages(
        self, user: str, *, after: int | None = None, before: int | None = None, limit: int | None = None
    ) -> list[Message]:
        """A window of a User's Message log, ascending by seq."""
        return self._do(read_messages(user, after, before, limit))

    def publish(self, statement: str) -> Decision:
        """Publish a Decision (signed, numbered, stored)."""
        return self._do(publish(statement))

    def sign(self, statement: str, typ: str | None = None) -> str:
        """A compact JWS of ``{statement}`` (nothing stored)."""
        return self._do(sign(statement, typ))

    def set_schedule(self, name: str, spec: dict[str, Any], *, data: Any = None, until: str | None = None) -> Schedule:
        """Create or replace the Schedule ``name``."""
        return self._do(set_schedule(name, spec, data, until))

    def cancel_schedule(self, name: str) -> None:
        """Delete the live Schedule ``name`` (404 when there is none)."""
        return self._do(cancel_schedule(name))

    def signals(self, *, kind: str | None = None, limit: int | None = None) -> list[Signal]:
        """Signals, newest first."""
        return self._do(signals(kind, limit))

    def runs(self, *, signal_id: str | None = None, limit: int | None = None) -> list[RunRecord]:
        """Runs, newest first."""
        return self._do(runs(signal_id, limit))

    def run(self, run_id: str) -> RunRecord:
        return self._do(run(run_id))

    def user(self, user_id: str) -> User:
        return self._do(user(user_id))


class AsyncClient:
    """The Agent server at ``url`` (default ``$AGENT_SERVER_URL``), called from asyncio."""

    def __init__(self, url: str | None = None, *, timeout: float = TIMEOUT_S) -> None:
        self.url = _base_url(url)
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _do(self, call: _Call[T]) -> T:
        try:
            response = await self._http.send(call.request(self._http))
        except httpx.HTTPError as exc:
            raise _unreachable(self.url, exc) from None
        return call.outcome(response)

    async def send_message(self, user_id: str, text: str) -> Message:
        return await self._do(send_message(user_id, text))

    async def read_messages(
        self, user: str, *, after: int | None = None, before: int | None = None, limit: int | None = None
    ) -> list[Message]:
        return await self._do(read_messages(user, after, before, limit))

    async def publish(self, statement: str) -> Decision:
        return await self._do(publish(statement))

    async def sign(self, statement: str, typ: str | None = None) -> str:
        return await self._do(sign(statement, typ))

    async def set_schedule(
        self, name: str, spec: dict[str, Any], *, data: Any = None, until: str | None = None
    ) -> Schedule:
        return await self._do(set_schedule(name, spec, data, until))

    async def cancel_schedule(self, name: str) -> None:
        return await self._do(cancel_schedule(name))

    async def signals(self, *, kind: str | None = None, limit: int | None = None) -> list[Signal]:
        return await self._do(signals(kind, limit))

    async def runs(self, *, signal_id: str | None = None, limit: int | None = None) -> list[RunRecord]:
        return await self._do(runs(signal_id, limit))

    async def run(self, run_id: str) -> RunRecord:
        return await self._do(run(run_id))

    async def user(self, user_id: str) -> User:
        return await self._do(user(user_id))
