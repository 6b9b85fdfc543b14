"""``/mcp`` as an HTTP endpoint of the Agent server, on a real ``serve`` on both backends: the spec's
cross-cutting rules, its limits, several sessions at once and clients that go away mid-call."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp
import pytest

from tests import served
from tests.http.test_connections import connect as open_connection
from tests.http.test_connections import error_of, exchange
from tests.mcp.conftest import CALL_TIMEOUT_S, TRANSPORTS, connect, succeeded

pytestmark = [pytest.mark.processes, pytest.mark.e2e]

LIMIT = 4096
# What an MCP client sends with its POSTs.
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


@pytest.fixture
def served_gateway(tmp_path: Path, database_url: str) -> Any:
    """A served gateway with a small body limit, so that an oversized request is cheap to make,
    and two HTTP processes sharing the Agent server's address (the kernel spreads connections)."""
    env = {"AGENT_GATEWAY_HTTP_MAX_BODY_BYTES": str(LIMIT), "AGENT_GATEWAY_HTTP_WORKERS": "2"}
    with served.ServedGateway.start(tmp_path / "deployment", database_url, env=env) as gateway:
        yield gateway


def tools_call(name: str, arguments: dict[str, Any], request_id: int = 1) -> bytes:
    """A ``tools/call`` request as the SDK's own types write it."""
    request = mcp.types.JSONRPCRequest(
        jsonrpc="2.0", id=request_id, method="tools/call", params={"name": name, "arguments": arguments}
    )
    return request.model_dump_json(by_alias=True, exclude_none=True).encode()


def assert_error_body(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()
    assert set(error) == {"statusCode", "error", "message"} and error["statusCode"] == status
    return error["message"]


def test_the_spec_s_http_rules_hold_at_mcp(served_gateway: served.ServedGateway) -> None:
    url = f"{served_gateway.agent_url}/mcp"
    valid = tools_call("list_users", {})
    answered = httpx.post(url, content=valid, headers=HEADERS, timeout=CALL_TIMEOUT_S)
    assert answered.status_code == 200 and answered.headers["content-type"] == "application/json"
    # Stateless: no session ties a client to the process that answered it.
    assert "mcp-session-id" not in answered.headers
    # An unknown query parameter is 400 with the JSON error body; it is never ignored.
    for query in ("x=1", "limit=5", "sessionId=abc"):
        message = assert_error_body(httpx.post(f"{url}?{query}", content=valid, headers=HEADERS), 400)
        assert "takes no query parameters" in message
    # A malformed or oversized request is a 4xx, never a 500.
    for content in (b"{not json", b"[]", b'{"jsonrpc": "2.0"}', b"\xff\xfe", b'"text"', b"null"):
        response = httpx.post(url, content=content, headers=HEADERS, timeout=CALL_TIMEOUT_S)
        assert 400 <= response.status_code < 500, (content, response.status_code, response.text)
    for headers in ({"content-type": "text/plain"}, {}):
        response = httpx.post(url, content=valid, headers=headers, timeout=CALL_TIMEOUT_S)
        assert 400 <= response.status_code < 500, (headers, response.status_code)
    too_big = tools_call("publish_decision", {"statement": "x" * LIMIT})
    assert "over 4096 bytes" in assert_error_body(httpx.post(url, content=too_big, headers=HEADERS), 413)
    chunked = httpx.post(url, content=iter([too_big[:LIMIT], too_big[LIMIT:]]), headers=HEADERS)
    assert_error_body(chunked, 413)
    # Stateless: no stream to open, no session to end.
    for method in ("GET", "DELETE", "PUT"):
        response = httpx.request(method, url, headers=HEADERS, timeout=CALL_TIMEOUT_S)
        assert_error_body(response, 405)
        assert response.headers["allow"] == "POST"
    # Nothing above published anything; the Agent server and /mcp still answer.
    assert httpx.get(f"{served_gateway.agent_url}/decisions").json() == {"decisions": []}
    assert httpx.post(url, content=valid, headers=HEADERS, timeout=CALL_TIMEOUT_S).status_code == 200
    assert " ERROR " not in served_gateway.output() and "Traceback" not in served_gateway.output()


def test_mcp_is_on_the_agent_server_only_and_out_of_both_openapi_documents(served_gateway: served.ServedGateway) -> None:
    response = httpx.post(f"{served_gateway.public_url}/mcp", content=tools_call("list_users", {}), headers=HEADERS)
    assert_error_body(response, 404)
    for base in (served_gateway.agent_url, served_gateway.public_url):
        paths = httpx.get(f"{base}/openapi.json").json()["paths"]
        assert "/mcp" not in paths and paths


def test_the_agent_server_s_connection_limit_holds_at_mcp(tmp_path: Path, database_url: str) -> None:
    env = {"AGENT_GATEWAY_AGENT_MAX_CONNECTIONS": "2", "AGENT_GATEWAY_HTTP_HEADER_TIMEOUT_MS": "600000"}
    with served.ServedGateway.start(tmp_path / "deployment", database_url, env=env) as gateway:
        held = [open_connection(gateway.agent_url) for _ in range(2)]
        try:
            body = tools_call("list_users", {})
            request = (
                b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Accept: application/json, text/event-stream\r\nConnection: close\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            status, error = error_of(exchange(gateway.agent_url, request))
            assert status == 503 and "connection limit" in error["message"]
        finally:
            for sock in held:
                sock.close()


async def test_several_sessions_at_once(served_gateway: served.ServedGateway) -> None:
    user = served_gateway.cli_json("users", "add")
    per_session = 5

    async def session(transport: str, index: int) -> list[int]:
        async with connect(served_gateway, transport) as client:
            seqs = []
            for n in range(per_session):
                decision = succeeded(await client.call_tool("publish_decision", {"statement": f"{transport} {index} {n}"}))
                seqs.append(decision["seq"])
                succeeded(await client.call_tool("send_message", {"userId": user["id"], "text": f"{index}.{n}"}))
            return seqs

    sessions = [(transport, index) for index, transport in enumerate(TRANSPORTS * 2)]
    published = await asyncio.gather(*(session(transport, index) for transport, index in sessions))
    seqs = [seq for seqs in published for seq in seqs]
    assert len(set(seqs)) == len(seqs) == len(sessions) * per_session
    decisions = httpx.get(f"{served_gateway.agent_url}/decisions", params={"after": "0", "limit": "200"}).json()
    assert sorted(decision["seq"] for decision in decisions["decisions"]) == sorted(seqs)
    log = httpx.get(f"{served_gateway.agent_url}/messages", params={"user": user["id"], "limit": "200"}).json()
    assert [message["seq"] for message in log["messages"]] == list(range(1, len(seqs) + 1))


async def test_clients_that_go_away_mid_call_leave_the_server_healthy(served_gateway: served.ServedGateway) -> None:
    url = served_gateway.agent_url
    # Raw: the whole request sent, the connection closed before the answer is read.
    for n in range(20):
        body = tools_call("publish_decision", {"statement": f"abandoned {n}"}, n)
        request = (
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Accept: application/json, text/event-stream\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        with open_connection(url) as sock:
            sock.sendall(request)
            sock.shutdown(socket.SHUT_RDWR)
    # Half a request: the client goes away while the server reads the body.
    with open_connection(url) as sock:
        sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{")
    # The SDK's client, giving up on a call at various points and leaving. What its own
    # teardown then raises (the connection it dropped, now and then) is the client's affair:
    # this test is about the server.
    for delay in (0, 0.001, 0.005, 0.02, 0.05, 0.1):
        for transport in TRANSPORTS:
            with contextlib.suppress(Exception):
                async with connect(served_gateway, transport) as client:
                    with anyio.move_on_after(delay):
                        await client.call_tool("publish_decision", {"statement": f"cancelled {delay}"})
    # Healthy: new sessions work, every Decision that was published is whole and readable.
    async with connect(served_gateway, "http") as client:
        decision = succeeded(await client.call_tool("publish_decision", {"statement": "after"}))
    decisions = httpx.get(f"{url}/decisions", params={"after": "0", "limit": "200"}).json()["decisions"]
    assert decisions[-1] == decision
    for published in decisions:
        assert httpx.get(f"{url}/decisions/{published['seq']}").json() == published
    output = served_gateway.output()
    assert " ERROR " not in output and "Traceback" not in output, output


# A gateway that starts, serves a Message and stops, then answers MCP's initialize on /mcp; it
# prints whether the MCP SDK was imported before that request and after it.
_LAZY_PROBE = """
import asyncio, sys
from pathlib import Path
import httpx
from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.users import service as users

async def main(url, key):
    settings = config.Settings(token_ttl_ms=3_600_000, database_url=url, signing_key_file=Path(key), scrypt=config.ScryptCost(log_n=4, block_size=8, parallelism=1))
    gateway = Gateway(settings)
    await gateway.start()
    try:
        async with gateway.store.transaction() as conn:
            user = await users.admit(conn)
        transport = httpx.ASGITransport(app=gateway.agent_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as agent:
            sent = await agent.post("/messages", json={"userId": user.id, "text": "hi"})
            assert sent.status_code == 201, sent.text
            before = "mcp" in sys.modules
            answer = await agent.post("/mcp", headers={"Accept": "application/json, text/event-stream"}, json={
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}},
            })
            print(before, answer.status_code, answer.json()["result"]["serverInfo"]["name"] != "", "mcp" in sys.modules)
    finally:
        await gateway.stop()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_the_mcp_sdk_is_loaded_by_the_first_request_to_mcp_not_by_the_gateways_start(
    database_url: str, signing_key_file: Path, tmp_path: Path
) -> None:
    """The SDK is about a third of a gateway's start, and many deployments never use /mcp."""
    result = subprocess.run(
        [sys.executable, "-c", _LAZY_PROBE, database_url, str(signing_key_file)],
        capture_output=True, text=True, check=False, timeout=CALL_TIMEOUT_S, env=served.cli_env(tmp_path / "unused.toml"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "200", "True", "True"]
