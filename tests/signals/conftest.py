"""Fixtures for the Signal Worker: gateways with Handlers and runtimes, and waiting for outcomes."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.runtimes.runtime import RunFailed
from agent_gateway.signals import service
from agent_gateway.store.engine import Store
from agent_gateway.store.queries.runs import Run
from agent_gateway.store.queries.signals import Signal

AGENT_PROGRAM = Path(__file__).resolve().parents[1] / "agent_program.py"
# A guard against a hung test, not a measurement: outcomes normally arrive in milliseconds.
OUTCOME_DEADLINE_S = 300


class Recording:
    """An in-process runtime that records each Run it is handed; ``fail`` maps a Prompt to a failure."""

    def __init__(self, fail: dict[str, str] | None = None) -> None:
        self.runs: list[Run] = []
        self.fail = fail or {}

    async def run(self, run: Run) -> None:
        self.runs.append(run)
        if run.prompt in self.fail:
            raise RunFailed(self.fail[run.prompt])


class AgentProgram:
    """The tests' agent program under the command runtime, and what it recorded."""

    def __init__(self, directory: Path) -> None:
        # tmp_path/agent-files: the folder a confined program may write (the settings fixture's runtime.sandbox_rw).
        (directory / "agent-files").mkdir(exist_ok=True)
        self.record = directory / "agent-files" / "agent-record.jsonl"

    def command(self, mode: str, *args: str) -> tuple[str, ...]:
        return (sys.executable, str(AGENT_PROGRAM), str(self.record), mode, *args)

    def sandbox_env(self) -> dict[str, str]:
        """What lets a served gateway's confined program write its record (``runtime.sandbox_rw``)."""
        return {"AGENT_GATEWAY_RUNTIME_SANDBOX_RW": json.dumps([str(self.record.parent)])}

    def calls(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def release(self) -> None:
        self.record.with_name(self.record.name + ".release").touch()

    async def wait_started(self, count: int = 1) -> None:
        await until(lambda: len(self.calls()) >= count)


async def until(condition: Callable[[], Any]) -> None:
    """Wait until ``condition`` (plain or async) holds, failing the test after a generous deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + OUTCOME_DEADLINE_S
    while not await _value(condition()):
        if loop.time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


async def emit(store: Store, kind: str, payload: Any) -> str:
    async with store.transaction() as conn:
        return await service.emit(conn, kind, payload)


async def signal_of(store: Store, signal_id: str) -> Signal:
    async with store.read() as conn:
        return await service.get_signal(conn, signal_id)


async def runs_of(store: Store, signal_id: str) -> list[Run]:
    """The Runs of one Signal in the order they were recorded.

    ``list_runs`` answers newest first: by startedAt, ties (Runs started within one
    millisecond) by recording order, not-started Runs first. A Signal's Runs start in
    recording order, so the reverse is that order, with any never started last.
    """
    async with store.read() as conn:
        runs = await service.list_runs(conn, 200, signal_id)
    return runs[::-1]


async def finished(store: Store, signal_id: str) -> Signal:
    """Wait for the Signal to end (``done`` or ``failed``) and return it."""

    async def ended() -> bool:
        return (await signal_of(store, signal_id)).state in ("done", "failed")

    await until(ended)
    return await signal_of(store, signal_id)


async def _value(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@pytest.fixture
def agent_program(tmp_path: Path) -> AgentProgram:
    return AgentProgram(tmp_path)


GatewayFactory = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def make_gateway(settings: config.Settings) -> AsyncIterator[GatewayFactory]:
    """Start gateways with chosen settings, Handlers and runtime; stop them at the end."""
    started: list[Gateway] = []

    async def make(
        runtime: Any = None, register: dict[str, Any] | None = None, **changes: Any
    ) -> Gateway:
        """A started gateway: ``changes`` to its settings, ``register`` Handlers by kind, ``runtime``."""
        gateway = Gateway(dataclasses.replace(settings, **changes))
        for kind, handler in (register or {}).items():
            gateway.handlers.register(kind, handler)
        if runtime is not None:
            gateway.runtime = runtime
        await gateway.start()
        started.append(gateway)
        return gateway

    yield make
    for gateway in reversed(started):
        await gateway.stop()


@pytest.fixture
async def idle_gateway(gateway: Gateway) -> Gateway:
    """The gateway with its worker stopped, so the records written in a test stay as written."""
    assert gateway.worker is not None
    await gateway.stop_worker()
    return gateway
