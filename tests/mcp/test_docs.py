"""docs/agents/mcp.md as written: its ``.mcp.json`` configurations and its Python program, run
against a real served gateway (its Agent server address put where the page says 127.0.0.1:8701)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import mcp
import pytest

from tests import served
from tests.mcp.conftest import CALL_TIMEOUT_S, succeeded

pytestmark = [pytest.mark.processes, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "agents" / "mcp.md"
PERFORMANCE = ROOT / "docs" / "performance" / "mcp.md"
DOCUMENTED_URL = "http://127.0.0.1:8701"


def blocks(language: str, gateway: served.ServedGateway) -> list[str]:
    """The page's fenced blocks of ``language``, pointed at ``gateway``."""
    found = re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    assert found, language
    return [block.replace(DOCUMENTED_URL, gateway.agent_url) for block in found]


async def test_the_mcp_json_configurations_connect(served_gateway: served.ServedGateway) -> None:
    by_url, by_command = (json.loads(block)["mcpServers"]["agent-gateway"] for block in blocks("json", served_gateway))
    assert by_url["type"] == "http"
    async with mcp.Client(by_url["url"], read_timeout_seconds=CALL_TIMEOUT_S) as client:
        assert succeeded(await client.call_tool("list_users", {})) == {"users": []}
    # The command as an agent CLI runs it: found on PATH, where the package installs it.
    env = served.cli_env(served_gateway.config, served_gateway.env)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    params = mcp.StdioServerParameters(command=by_command["command"], args=by_command["args"], env=env)
    async with mcp.Client(params, mode="legacy", read_timeout_seconds=CALL_TIMEOUT_S) as client:
        decision = succeeded(await client.call_tool("publish_decision", {"statement": "from the docs"}))
    assert decision["seq"] == 1


def test_the_python_program_runs(served_gateway: served.ServedGateway) -> None:
    (program,) = blocks("python", served_gateway)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    names, published = result.stdout.splitlines()
    assert "'publish_decision'" in names and "'send_message'" in names
    seq, jws = published.split(" ")
    assert seq == "1" and jws.count(".") == 2


def test_the_benchmark_command_of_the_performance_page_is_there() -> None:
    """The page's command and its options (the benchmark itself never runs in the tests)."""
    (command,) = re.findall(r"```sh\n(.*?)\n```", PERFORMANCE.read_text(), flags=re.DOTALL)
    program, flag, module, *arguments = command.split()
    assert (program, flag) == ("python", "-m")
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    for option in arguments[::2]:
        assert option in result.stdout, option
