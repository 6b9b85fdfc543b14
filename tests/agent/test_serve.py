"""``agent_gateway.agent.serve`` under both runtimes, with sync and async handlers, in real subprocesses."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent_gateway.runtimes.command import CommandRuntime
from agent_gateway.runtimes.persistent import PersistentRuntime
from agent_gateway.runtimes.runtime import RunFailed
from agent_gateway.store.queries.runs import Run

from tests import served

URL = "http://127.0.0.1:9999"
KIT_AGENT = Path(__file__).resolve().parent / "kit_agent.py"


@pytest.fixture(autouse=True)
def kit_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(served.SRC))


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=["per-run", "persistent"])
async def runtime(request: pytest.FixtureRequest, tmp_path: Path, flavour: str) -> AsyncIterator[Any]:
    argv = (sys.executable, str(KIT_AGENT), str(tmp_path / "record.jsonl"), flavour)
    if request.param == "per-run":
        yield CommandRuntime(argv, agent_server_url=URL)
        return
    persistent = PersistentRuntime(argv, agent_server_url=URL)
    yield persistent
    await persistent.close()


def recorded(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()]


def a_run(prompt: str, run_id: str = "r-1") -> Run:
    return Run(run_id, "s-1", "user_1", prompt, "running", None, None, None)


def failure(runtime: Any, message: str) -> str:
    """What a handler's exception becomes in the Run's error, by runtime."""
    if isinstance(runtime, CommandRuntime):
        return f"the agent program exited with status 1; stderr ends with:\n{message}"
    return message


async def test_handle_gets_the_run_and_a_client_of_the_agent_server(
    runtime: Any, flavour: str, tmp_path: Path
) -> None:
    await runtime.run(a_run("ok ü\nline 2"))
    await runtime.run(Run("r-2", "s-2", None, "print", "running", None, None, None))
    first, second = recorded(tmp_path)
    assert first == {
        "id": "r-1",
        "signalId": "s-1",
        "session": "user_1",
        "prompt": "ok ü\nline 2",
        "client": "Client" if flavour == "sync" else "AsyncClient",
        "url": URL,
    }
    assert (second["id"], second["session"], second["prompt"]) == ("r-2", None, "print")


async def test_an_exception_fails_the_run_with_its_message(runtime: Any, tmp_path: Path) -> None:
    with pytest.raises(RunFailed) as failed:
        await runtime.run(a_run("boom"))
    assert failed.value.message == failure(runtime, "boom went the agent")
    with pytest.raises(RunFailed) as bare:
        await runtime.run(a_run("bare", "r-2"))
    assert bare.value.message == failure(runtime, "KeyError")
    await runtime.run(a_run("ok", "r-3"))  # and the agent goes on
    assert [entry["id"] for entry in recorded(tmp_path)] == ["r-1", "r-2", "r-3"]
