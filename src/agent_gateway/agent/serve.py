"""``serve(handle)``: the agent program's side of both runtimes.

Under the persistent runtime (no ``AGENT_GATEWAY_RUN_ID`` in the environment)
it reads Runs as JSON lines on stdin and answers each on stdout, ``done`` when
``handle(run, client)`` returns and ``failed`` with the exception's message when
it raises. So that nothing ``handle`` prints (nor any program it starts) can
break the protocol, the protocol keeps a private copy of stdout and file
descriptor 1 becomes stderr. Under the command runtime (``runtime.mode =
"per-run"``) it reads the one Prompt on stdin, takes the Run from the
environment, and exits 0, or 1 with the message on stderr.

``handle`` may be a plain function (given a :class:`Client`) or a coroutine
function (given an :class:`AsyncClient`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import IO, Any, Union

from agent_gateway.agent.client import AsyncClient, Client

Handle = Union[Callable[["Run", Client], Any], Callable[["Run", AsyncClient], Awaitable[Any]]]


@dataclasses.dataclass(frozen=True)
class Run:
    """The Run handed to the agent: its id, Signal, Session and Prompt.

    The same Run as a :class:`~agent_gateway.records.Run` record (the kit's
    ``RunRecord``), seen from inside: only what the gateway hands over to start
    it, as attributes, since its state and times are still being written.
    """

    id: str
    signal_id: str
    session: str | None
    prompt: str


def serve(handle: Handle, *, url: str | None = None) -> int:
    """Serve Runs to ``handle`` until stdin ends; the exit status for ``sys.exit``."""
    if "AGENT_GATEWAY_RUN_ID" in os.environ:
        return _serve_one(handle, url)
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    if inspect.iscoroutinefunction(handle):
        asyncio.run(_serve_async(handle, url, protocol))
    else:
        with Client(url) as client:
            for run in _runs(sys.stdin):
                _answer(protocol, run, _failure_of(lambda: handle(run, client)))
    return 0


def _serve_one(handle: Handle, url: str | None) -> int:
    run = Run(
        os.environ["AGENT_GATEWAY_RUN_ID"],
        os.environ.get("AGENT_GATEWAY_SIGNAL_ID", ""),
        os.environ.get("AGENT_GATEWAY_SESSION") or None,
        sys.stdin.read(),
    )
    if inspect.iscoroutinefunction(handle):

        async def once() -> str | None:
            async with AsyncClient(url) as client:
                return await _failure_of_async(handle(run, client))

        error = asyncio.run(once())
    else:
        with Client(url) as client:
            error = _failure_of(lambda: handle(run, client))
    if error is None:
        return 0
    print(error, file=sys.stderr)
    return 1


async def _serve_async(handle: Handle, url: str | None, protocol: IO[str]) -> None:
    loop = asyncio.get_running_loop()
    async with AsyncClient(url) as client:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            run = _parse(line)
            if run is not None:
                _answer(protocol, run, await _failure_of_async(handle(run, client)))


def _runs(stream: IO[str]) -> Iterator[Run]:
    for line in stream:
        run = _parse(line)
        if run is not None:
            yield run


def _parse(line: str) -> Run | None:
    """The Run of a gateway line; None for any other message type (a later protocol's)."""
    message = json.loads(line)
    if message.get("type") != "run":
        return None
    run = message["run"]
    return Run(run["id"], run["signalId"], run.get("session"), run["prompt"])


def _answer(protocol: IO[str], run: Run, error: str | None) -> None:
    answer = {"type": "done", "run": run.id} if error is None else {"type": "failed", "run": run.id, "error": error}
    protocol.write(json.dumps(answer) + "\n")
    protocol.flush()


def _failure_of(call: Callable[[], Any]) -> str | None:
    try:
        call()
    except Exception as exc:
        return _describe(exc)
    return None


async def _failure_of_async(awaitable: Awaitable[Any]) -> str | None:
    try:
        await awaitable
    except Exception as exc:
        return _describe(exc)
    return None


def _describe(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
