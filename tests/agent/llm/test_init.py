"""``agent-gateway init DIR --agent llm``: the config it writes, and the options it refuses with one line."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from agent_gateway import config
from agent_gateway.agent.llm.providers import FUNCTION_MODELS_ENV
from tests.cli.test_main import one_error_line, run_all
from tests.served import run_cli

pytestmark = pytest.mark.processes


def init(directory: Path, *args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return run_cli("init", str(directory), *args, config=directory / "gateway.toml", env=env)


def test_init_writes_the_llm_agent_its_instructions_and_handlers(tmp_path: Path) -> None:
    hosted, local = run_all(
        [
            (tmp_path / "hosted", "--agent", "llm", "--model", "anthropic:claude-sonnet-4-5", "--demo-user"),
            (tmp_path / "local", "--agent", "llm", "--model", "openai:llama3.2",
             "--base-url", "http://localhost:11434/v1"),
        ],
        lambda case: init(*case),
    )
    assert hosted.returncode == 0, hosted.stderr
    assert "$ANTHROPIC_API_KEY" in hosted.stdout and "workspace/instructions.md" in hosted.stdout
    assert "Demo User" in hosted.stdout
    text = (tmp_path / "hosted" / "gateway.toml").read_text()
    document = tomllib.loads(text)
    assert document["runtime"] == {
        "command": [sys.executable, "-m", "agent_gateway.agent.llm", "--model", "anthropic:claude-sonnet-4-5",
                    "--api-key-env", "ANTHROPIC_API_KEY", "--instructions", "instructions.md"],
        "mode": "persistent",
        "workdir": "workspace",
        # Confinement: the model's host may be reached, the key's variable is passed (never its value).
        "allow_hosts": ["api.anthropic.com:443"],
        "env_pass": ["ANTHROPIC_API_KEY"],
    }
    handlers = document["handlers"]
    assert handlers["message.received"] == {
        "template": "A message from user {{ userId }}:\n\n{{ text }}", "session": "user_{{ userId }}"
    }
    assert set(handlers) == {"message.received", "service_schedule_fired"}
    assert (tmp_path / "hosted" / "workspace" / "instructions.md").read_text().startswith("You are the shared agent")
    settings = config.load(tmp_path / "hosted" / "gateway.toml")  # the gateway takes it as written
    assert settings.runtime_workdir == tmp_path / "hosted" / "workspace"
    assert settings.runtime_env_pass == ("ANTHROPIC_API_KEY",)

    assert local.returncode == 0, local.stderr
    text = (tmp_path / "local" / "gateway.toml").read_text()
    assert '"--base-url", "http://localhost:11434/v1", "--api-key-env", "OPENAI_API_KEY"' in text
    # The base URL's host, and its address: the egress proxy lets a loopback or private address through
    # only when it is listed itself.
    assert tomllib.loads(text)["runtime"]["allow_hosts"][:2] == ["localhost:11434", "127.0.0.1:11434"]
    assert "a local server may need none" in local.stdout


def test_init_refuses_bad_agent_options_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    cases = {
        ("--agent", "llm"): "--agent llm needs --model PROVIDER:MODEL, such as openai:gpt-4o",
        ("--agent", "robot"): "--agent takes echo or llm (got 'robot')",
        ("--model", "openai:gpt-4o"): "--model is for --agent llm",
        ("--agent", "llm", "--model", "gpt-4o"): "--model must be PROVIDER:MODEL, such as openai:gpt-4o (got 'gpt-4o')",
        ("--agent", "llm", "--model", "nosuch:model"): "unknown provider 'nosuch': use openai:, anthropic: "
        "(openai: with --base-url for any OpenAI-compatible server)",
        ("--agent", "llm", "--model", "anthropic:c", "--base-url", "http://h/v1"):
            "--base-url is for openai: (a server speaking the Chat Completions API)",
        ("--agent", "llm", "--model", "openai:m", "--base-url", "ftp://h/v1"):
            "--base-url must be an http:// or https:// URL (got 'ftp://h/v1')",
        ("--agent", "llm", "--model", "openai:m", "--api-key-env", "NOT A NAME"):
            "--api-key-env must be an environment variable's name (got 'NOT A NAME')",
        ("--agent", "llm", "--model", "function:tests.agent.llm.scripted:respond"):
            f"function: models are a testing hook, enabled by {FUNCTION_MODELS_ENV}=1",
    }
    folders = [tmp_path / f"d{n}" for n in range(len(cases))]
    results = run_all(list(zip(folders, cases)), lambda case: init(case[0], *case[1]))
    for folder, (args, line), result in zip(folders, cases.items(), results):
        assert one_error_line(result) == f"agent-gateway: error: {line}", args
        assert not folder.exists()


def test_init_never_overwrites_an_instructions_file(tmp_path: Path) -> None:
    instructions = tmp_path / "d" / "workspace" / "instructions.md"
    instructions.parent.mkdir(parents=True)
    instructions.write_text("mine")
    result = init(tmp_path / "d", "--agent", "llm", "--model", "openai:gpt-4o")
    assert one_error_line(result) == f"agent-gateway: error: {instructions} exists; init never overwrites"
    assert instructions.read_text() == "mine" and not (tmp_path / "d" / "gateway.toml").exists()


@pytest.mark.parametrize("args", [("--model", "openai:gpt-4o"), ("--model", "anthropic:claude-sonnet-4-5")])
async def test_a_hosted_model_without_its_api_key_fails_each_run_with_one_line(
    args: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_gateway.agent import Run
    from agent_gateway.agent.llm.agent import LLMAgent, Settings
    from agent_gateway.agent.llm.faults import RunError

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    agent = LLMAgent(Settings(model=args[1], instructions=tmp_path / "i.md", sessions=tmp_path), "http://127.0.0.1:9")
    env = "OPENAI_API_KEY" if args[1].startswith("openai") else "ANTHROPIC_API_KEY"
    for n in range(2):  # every Run, not an exit (which would restart the program in a loop)
        with pytest.raises(RunError) as failed:
            await agent.handle(Run(f"r{n}", "s", "user_1", "hello"), None)  # type: ignore[arg-type]
        assert str(failed.value) == f"no API key for {args[1]}: ${env} is not set in the gateway's environment"
