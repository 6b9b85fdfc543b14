"""``agent-gateway mcp``: the real command as a subprocess, its Agent server found as documented,
stdout carrying the protocol only, and its failures as one line or a tool error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mcp
import pytest
from mcp.client.stdio import stdio_client

from agent_gateway.cli.mcp import agent_address
from agent_gateway.config import Address

from tests import served
from tests.mcp.conftest import CALL_TIMEOUT_S, stdio_parameters, succeeded

pytestmark = [pytest.mark.processes, pytest.mark.e2e]


def messages_in(*messages: mcp.types.JSONRPCRequest | mcp.types.JSONRPCNotification) -> str:
    """Lines of stdin, as the SDK's own types write them."""
    return "".join(message.model_dump_json(by_alias=True, exclude_none=True) + "\n" for message in messages)


HANDSHAKE = (
    mcp.types.JSONRPCRequest(
        jsonrpc="2.0",
        id=1,
        method="initialize",
        params={"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}},
    ),
    mcp.types.JSONRPCNotification(jsonrpc="2.0", method="notifications/initialized"),
    mcp.types.JSONRPCRequest(jsonrpc="2.0", id=2, method="tools/list"),
    mcp.types.JSONRPCRequest(
        jsonrpc="2.0", id=3, method="tools/call", params={"name": "publish_decision", "arguments": {"statement": "by stdio"}}
    ),
)


def test_stdout_carries_the_protocol_only_and_logs_go_to_stderr(served_gateway: served.ServedGateway, tmp_path: Path) -> None:
    # No --agent-url and no $AGENT_SERVER_URL: the configuration's agent.listen.
    env = served.cli_env(served_gateway.config, served_gateway.env)
    env.pop("AGENT_SERVER_URL", None)
    env["AGENT_GATEWAY_LOG_LEVEL"] = "DEBUG"
    with open(tmp_path / "stderr", "w+") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "agent_gateway", "mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            text=True,
            start_new_session=True,
        )
        try:
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(messages_in(*HANDSHAKE))
            process.stdin.flush()
            # Every line of stdout is a JSON-RPC message: the three answers, in whatever order.
            answers = {}
            while len(answers) < 3:
                answer = mcp.types.jsonrpc_message_adapter.validate_json(process.stdout.readline())
                answers[answer.id] = answer
            process.stdin.close()  # the end of stdin ends the server
            assert process.wait(timeout=CALL_TIMEOUT_S) == 0
            assert process.stdout.read() == ""
        finally:
            served.stop_process(process)  # type: ignore[arg-type]
            for pipe in (process.stdin, process.stdout):
                if pipe is not None and not pipe.closed:
                    pipe.close()
        stderr.seek(0)
        logged = stderr.read()
    assert set(answers) == {1, 2, 3}
    assert [tool["name"] for tool in answers[2].result["tools"]][:3] == ["send_message", "read_messages", "publish_decision"]
    decision = answers[3].result["structuredContent"]
    assert decision["statement"] == "by stdio" and not answers[3].result.get("isError")
    assert f"for the Agent server at {served_gateway.agent_url}" in logged
    assert "by stdio" not in logged  # no Statement text in the logs


async def test_agent_server_url_from_the_environment(served_gateway: served.ServedGateway) -> None:
    params = stdio_parameters(served_gateway)
    params.env = {**(params.env or {}), "AGENT_SERVER_URL": served_gateway.agent_url, "AGENT_GATEWAY_CONFIG": "/nonexistent.toml"}
    async with mcp.Client(params, mode="legacy", read_timeout_seconds=CALL_TIMEOUT_S) as client:
        assert succeeded(await client.call_tool("list_users", {})) == {"users": []}


async def test_an_unreachable_agent_server_is_a_tool_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{served.free_port()}"
    env = {**served.cli_env(tmp_path / "absent.toml")}
    params = mcp.StdioServerParameters(command=sys.executable, args=["-m", "agent_gateway", "mcp", "--agent-url", url], env=env)
    with open(tmp_path / "stderr", "w") as errlog:
        async with mcp.Client(stdio_client(params, errlog=errlog), mode="legacy", read_timeout_seconds=CALL_TIMEOUT_S) as client:
            result = await client.call_tool("publish_decision", {"statement": "x"})
    assert result.is_error and f"the Agent server at {url} did not answer" in result.content[0].text


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ((), {}, "agent-gateway: error: no Agent server: pass --agent-url, set $AGENT_SERVER_URL, or give the configuration (--config or $AGENT_GATEWAY_CONFIG)"),
        (("--agent-url", "ftp://host"), {}, "agent-gateway: error: --agent-url must be an http:// or https:// URL (got 'ftp://host')"),
        ((), {"AGENT_SERVER_URL": "localhost:8701"}, "agent-gateway: error: --agent-url must be an http:// or https:// URL (got 'localhost:8701')"),
    ],
)
def test_no_usable_agent_server_url_is_one_line(tmp_path: Path, args: tuple[str, ...], env: dict[str, str], message: str) -> None:
    clean = {k: v for k, v in served.cli_env(tmp_path / "x.toml").items() if not k.startswith("AGENT_GATEWAY_")}
    clean.pop("AGENT_SERVER_URL", None)
    result = subprocess.run(
        [sys.executable, "-m", "agent_gateway", "mcp", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        input="",
        timeout=600,
    )
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.strip() == message


def test_a_server_on_every_address_is_called_on_loopback() -> None:
    assert agent_address(Address("0.0.0.0", 8701)) == "http://127.0.0.1:8701"
    assert agent_address(Address("::", 8701)) == "http://[::1]:8701"
    assert agent_address(Address("10.0.0.5", 8701)) == "http://10.0.0.5:8701"
