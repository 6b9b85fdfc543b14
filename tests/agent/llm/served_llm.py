"""A real gateway running the reference LLM agent, as ``init --agent llm`` writes it, and its Users."""

from __future__ import annotations

import asyncio
import contextlib
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from agent_gateway.agent.llm.providers import FUNCTION_MODELS_ENV
from tests import served

ROOT = Path(__file__).resolve().parents[3]
SCRIPTED = "function:tests.agent.llm.scripted:respond"
# Ceilings for a broken build on a loaded machine, never expectations.
ANSWER_DEADLINE_S = 300


def env(database_url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Free ports, the database, the testing hook (init passes it to the agent in runtime.env_pass), and
    this checkout's tests importable by the agent."""
    return {
        "AGENT_GATEWAY_DATABASE_URL": database_url,
        "AGENT_GATEWAY_PUBLIC_LISTEN": f"127.0.0.1:{served.free_port()}",
        "AGENT_GATEWAY_AGENT_LISTEN": f"127.0.0.1:{served.free_port()}",
        "AGENT_GATEWAY_OPS_LISTEN": f"127.0.0.1:{served.free_port()}",
        "AGENT_GATEWAY_AUTH_SCRYPT_LOGN": "10",
        "PYTHONPATH": f"{served.SRC}:{ROOT}",
        FUNCTION_MODELS_ENV: "1",
        # The agent runs confined, as deployed: a missing sandbox fails the test rather than pass unconfined.
        "AGENT_GATEWAY_RUNTIME_SANDBOX": "bubblewrap",
        **(extra or {}),
    }


def init(directory: Path, *args: str, extra: dict[str, str] | None = None) -> str:
    """``agent-gateway init DIRECTORY --agent llm ARGS``; what it printed."""
    result = served.run_cli(
        "init", str(directory), "--agent", "llm", *args, config=directory / "gateway.toml", env=extra
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def command(directory: Path) -> list[str]:
    """The agent's command as init wrote it."""
    return tomllib.loads((directory / "gateway.toml").read_text())["runtime"]["command"]


@contextlib.contextmanager
def gateway(directory: Path, variables: dict[str, str]) -> Iterator[served.ServedGateway]:
    started = served.ServedGateway.spawn_on_free_ports(directory, variables)
    try:
        yield started
    finally:
        started.stop()


def users(gateway: served.ServedGateway, count: int) -> list[User]:
    """``count`` new Users, each with a Token (the CLI's commands, in this process)."""

    def one() -> User:
        user = gateway.cli_json("users", "add")
        token = gateway.cli_json("tokens", "issue", user["id"])["token"]
        return User(gateway, user["id"], token)

    return [one() for _ in range(count)]


class User:
    def __init__(self, gateway: served.ServedGateway, id: str, token: str) -> None:
        self.id = id
        self.url = gateway.public_url
        self.headers = {"Authorization": f"Bearer {token}"}
        self.seq = 0  # the last seq of this User's log seen

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=120)

    async def say(self, text: str) -> None:
        async with self.http() as http:
            sent = await http.post("/messages", json={"text": text})
        assert sent.status_code == 201, sent.text
        self.seq = sent.json()["seq"]

    async def answers(self, count: int = 1, output: Any = None) -> list[str]:
        """The next ``count`` outbound Messages of this User's log, waited for."""
        deadline = time.monotonic() + ANSWER_DEADLINE_S
        found: list[dict[str, Any]] = []
        async with self.http() as http:
            while len(found) < count:
                assert time.monotonic() < deadline, output() if output else "no answer"
                await asyncio.sleep(0.05)
                page = await http.get("/messages", params={"after": str(self.seq)})
                assert page.status_code == 200, page.text
                found = [m for m in page.json()["messages"] if m["direction"] == "outbound"]
        self.seq = found[count - 1]["seq"]
        return [m["text"] for m in found[:count]]


async def run_settled(gateway: served.ServedGateway, count: int) -> list[dict[str, Any]]:
    """The newest ``count`` Runs once each has ended, newest first, the newest Signal's among them (a
    Message's Run is recorded only when the worker claims its Signal, after the POST has answered)."""
    deadline = time.monotonic() + ANSWER_DEADLINE_S
    async with httpx.AsyncClient(base_url=gateway.agent_url, timeout=60) as agent:
        [newest] = (await agent.get("/signals", params={"limit": "1"})).json()["signals"]
        while True:
            runs = (await agent.get("/runs", params={"limit": str(count)})).json()["runs"]
            ended = all(run["state"] in ("done", "failed") for run in runs)
            if len(runs) == count and ended and newest["id"] in {run["signalId"] for run in runs}:
                return runs
            assert time.monotonic() < deadline, gateway.output()
            await asyncio.sleep(0.05)
