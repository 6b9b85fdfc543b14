"""The model provider's HTTP path and its faults, once, against ``standin.py``: a local server speaking the
OpenAI Chat Completions API that STANDS IN FOR THE PROVIDER. The gateway, the agent program and the MCP
tools are real; the agent is set up as ``init --agent llm --model openai:... --base-url URL`` writes it.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.agent.llm import served_llm, standin

pytestmark = pytest.mark.e2e

KEY = "sk-standin-3f9c2b7e-SECRET-value"


async def test_the_agent_speaks_chat_completions_and_fails_a_run_per_provider_fault_with_one_line(
    tmp_path: Path, database_url: str
) -> None:
    directory = tmp_path / "deployment"
    with standin.serving(KEY) as (provider, base_url):
        variables = served_llm.env(database_url, {"STANDIN_API_KEY": KEY})
        printed = served_llm.init(
            directory, "--model", "openai:standin", "--base-url", base_url, "--api-key-env", "STANDIN_API_KEY",
            extra=variables,
        )
        assert "STANDIN_API_KEY" in printed and KEY not in printed
        config = (directory / "gateway.toml").read_text()
        assert KEY not in config
        runtime = tomllib.loads(config)["runtime"]
        assert runtime["allow_hosts"] == [base_url.removeprefix("http://").removesuffix("/v1")]
        assert runtime["env_pass"] == ["STANDIN_API_KEY"]
        # Short timeouts (under the stand-in's SLOW_S, far over its other answers even on a busy
        # machine), one retry: the settings of the agent, on its command line.
        command = [*served_llm.command(directory), "--timeout", "3", "--retries", "1"]
        variables["AGENT_GATEWAY_RUNTIME_COMMAND"] = json.dumps(command)
        with served_llm.gateway(directory, variables) as gateway:
            [user] = served_llm.users(gateway, 1)
            await user.say("hello")
            assert await user.answers(output=gateway.output) == ["provider says: hello (Prompts seen: 1)"]
            first = provider.requests[0]
            assert first["path"] == "/v1/chat/completions" and first["authorized"]
            tools = {tool["function"]["name"] for tool in first["body"]["tools"]}
            assert {"send_message", "publish_decision", "put_schedule", "sign_statement"} <= tools

            # A 429 once is retried by the library, and the Run goes on.
            await user.say("busy [429 once]")
            assert await user.answers(output=gateway.output) == ["provider says: busy [429 once] (Prompts seen: 2)"]

            faults = {
                "[429]": "model openai:standin: the provider is rate limiting (HTTP 429), still after retries; "
                "a later Run may pass",
                "[500]": "model openai:standin: the provider failed (HTTP 500), still after retries; "
                "a later Run may pass",
                "[slow]": "model openai:standin: the provider did not answer in time, after retries",
                "[revoked]": "model openai:standin: the provider refused the API key (HTTP 401); "
                "check the key the agent is given",
            }
            for word, error in faults.items():
                await user.say(f"please {word}")
                [run] = await served_llm.run_settled(gateway, 1)
                assert (run["state"], run["error"]) == ("failed", error), gateway.output()
                # Retried per the settings (one retry) where retrying can help, never without end.
                tries = [r for r in provider.requests if f"please {word}" in r["body"]["messages"][-1]["content"]]
                assert len(tries) == (1 if word == "[revoked]" else 2)
                # And the next Run works: the agent program never crash-loops.
                await user.say(f"after {word.strip('[]')}")
                [answer] = await user.answers(output=gateway.output)
                assert answer.startswith(f"provider says: after {word.strip('[]')}")
            # A failed Run leaves the Session as it was: its Prompt is not remembered.
            assert answer.endswith(f"(Prompts seen: {2 + len(faults)})")
            # The earlier turns went to the provider as ordinary messages.
            roles = [m["role"] for m in provider.requests[-2]["body"]["messages"] if m["role"] in ("user", "assistant", "tool")]
            assert roles[:5] == ["user", "assistant", "tool", "assistant", "user"]
            assert all(r["authorized"] for r in provider.requests)
    # The key reaches the provider only: never a Run's error, the log, a Session file or the config.
    sessions = directory / "workspace" / "sessions"
    assert all(KEY not in path.read_text() for path in sessions.iterdir())
    assert KEY not in gateway.output()
