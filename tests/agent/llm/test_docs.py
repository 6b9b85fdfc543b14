"""What docs/agents/llm-agent.md shows is what the code does: the extra, the runtime table, the options."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agent_gateway import deployment

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "agents" / "llm-agent.md"


def test_the_llm_extra_brings_pydantic_ai_with_mcp_and_the_core_install_does_not() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [llm] = project["optional-dependencies"]["llm"]
    assert llm.startswith("pydantic-ai-slim[") and "mcp" in llm.split("[")[1].split("]")[0]
    assert "agent-gateway[llm]" in project["optional-dependencies"]["test"]  # so CI tests it
    assert not any("pydantic-ai" in dependency for dependency in project["dependencies"])
    # From a clone: the project is on no package index, where 'agent-gateway[llm]' would be looked up.
    assert "pip install -e '.[llm]'" in PAGE.read_text()
    assert "pip install 'agent-gateway[llm]'" not in PAGE.read_text()


def test_the_runtime_table_of_the_page_is_the_one_init_writes() -> None:
    [shown] = re.findall(r"```toml\n(.*?)\n```", PAGE.read_text(), flags=re.DOTALL)
    runtime = tomllib.loads(shown)["runtime"]
    runtime["command"][0] = sys.executable
    written = deployment.LLMAgent("anthropic:claude-sonnet-4-5").runtime()
    assert runtime == tomllib.loads(written)["runtime"]


def test_every_option_of_the_settings_table_is_the_agents() -> None:
    text = PAGE.read_text()
    assert "python -m agent_gateway.agent.llm --help" in text
    table = text.split("## Settings", 1)[1].split("## When", 1)[0]
    options = re.findall(r"^\| `(--[a-z-]+)", table, flags=re.MULTILINE)
    result = subprocess.run(
        [sys.executable, "-m", "agent_gateway.agent.llm", "--help"], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    listed = set(re.findall(r"--[a-z-]+", result.stdout)) - {"--help"}
    assert set(options) == listed
    for option, default in re.findall(r"^\| `(--[a-z-]+)[^|]*\| `(\d+)` \|", table, flags=re.MULTILINE):
        assert f"(default: {default}" in " ".join(result.stdout.split()) or f"(default: {default}.0" in " ".join(
            result.stdout.split()
        ), option


def test_the_benchmark_command_of_the_performance_page_is_there() -> None:
    """The page's command and its options (the benchmark itself never runs in the tests)."""
    page = ROOT / "docs" / "performance" / "llm-agent.md"
    (command,) = re.findall(r"```sh\n(.*?)\n```", page.read_text(), flags=re.DOTALL)
    program, flag, module, *arguments = command.split()
    assert (program, flag, module) == ("python", "-m", "bench.llm_agent")
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    for option in arguments[::2]:
        assert option in result.stdout, option
