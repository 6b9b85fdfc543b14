"""The Agent server, ``/mcp`` included, answers only requests addressed to its own names, on a real
``serve`` on both backends: a web page in a browser on the agent's host can reach it neither by
DNS rebinding (its own name in ``Host``) nor from its own origin (``Origin``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_gateway import config
from tests import served
from tests.http.test_connections import connect, read_to_close
from tests.mcp.conftest import CALL_TIMEOUT_S, succeeded
from tests.mcp.conftest import connect as mcp_connect
from tests.mcp.test_endpoint import HEADERS, assert_error_body, tools_call

pytestmark = pytest.mark.e2e

REBOUND = "rebind.attacker.example"
ALLOWED = "gateway.internal"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, module_database_url: str) -> Iterator[served.ServedGateway]:
    env = {"AGENT_GATEWAY_AGENT_ALLOWED_HOSTS": f'["{ALLOWED}"]'}
    with served.ServedGateway.start(tmp_path_factory.mktemp("deployment"), module_database_url, env=env) as gateway:
        yield gateway


def port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def request(
    gateway: served.ServedGateway, method: str, path: str, headers: dict[str, str], **kwargs: Any
) -> httpx.Response:
    return httpx.request(method, gateway.agent_url + path, headers=headers, timeout=CALL_TIMEOUT_S, **kwargs)


# (method, path, body, extra headers): a read, a signature, a write, a stream and a tool call.
ROUTES = [
    ("GET", "/users", None, {}),
    ("POST", "/sign", b'{"statement": "rebound"}', {"content-type": "application/json"}),
    ("POST", "/decisions", b'{"statement": "rebound"}', {"content-type": "application/json"}),
    ("GET", "/messages/stream?user=00000000-0000-4000-8000-000000000000", None, {}),
    ("POST", "/mcp", tools_call("list_users", {}), HEADERS),
    ("POST", "/mcp", tools_call("publish_decision", {"statement": "rebound"}), HEADERS),
]


@pytest.mark.parametrize(("method", "path", "body", "extra"), ROUTES, ids=[str(n) for n in range(len(ROUTES))])
def test_a_rebound_name_is_refused_and_changes_nothing(
    gateway: served.ServedGateway, method: str, path: str, body: bytes | None, extra: dict[str, str]
) -> None:
    rebound = f"{REBOUND}:{port(gateway.agent_url)}"
    # As a browser sends it after DNS rebinding: the page's own name, its own origin.
    for headers in ({"Host": rebound, "Origin": f"http://{rebound}"}, {"Host": rebound}):
        response = request(gateway, method, path, {**extra, **headers}, content=body)
        assert "Host" in assert_error_body(response, 421)
    decisions = request(gateway, "GET", "/decisions", {}).json()["decisions"]
    assert not [decision for decision in decisions if decision["statement"] == "rebound"]


@pytest.mark.parametrize(
    "origin",
    [f"http://{REBOUND}", f"https://{REBOUND}:443", "null", "http://127.0.0.1.rebind.example", "http://10.0.0.7:8080"],
)
def test_an_origin_of_another_host_is_refused(gateway: served.ServedGateway, origin: str) -> None:
    for method, path, body, extra in ROUTES:
        response = request(gateway, method, path, {**extra, "Origin": origin}, content=body)
        assert "Origin" in assert_error_body(response, 403)


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "127.0.0.1:{port}", "127.1.2.3:{port}", "localhost", "LocalHost:{port}", "[::1]:{port}", "[::1]",
     f"{ALLOWED}:{{port}}", ALLOWED.upper()],
)
def test_the_agent_server_s_own_names_are_served(gateway: served.ServedGateway, host: str) -> None:
    host = host.format(port=port(gateway.agent_url))
    for origin in (None, f"http://{host}", "http://localhost:5173", f"https://{ALLOWED}"):
        headers = {"Host": host} | ({"Origin": origin} if origin else {})
        assert request(gateway, "GET", "/decisions", headers).status_code == 200
        response = request(gateway, "POST", "/mcp", {**HEADERS, **headers}, content=tools_call("list_users", {}))
        assert response.status_code == 200 and "result" in response.json()


@pytest.mark.parametrize("host", ["10.0.0.5:{port}", "192.168.1.9", "[fd00::5]:{port}", "[2001:db8::1]"])
def test_any_ip_address_in_host_is_served_but_only_a_loopback_origin(gateway: served.ServedGateway, host: str) -> None:
    """A browser sends an address in ``Host`` only for a URL holding it, never after rebinding a
    name: a container or a probe that calls the server by an address of its host is served. A
    page's ``Origin`` still has to be loopback or one of the server's names."""
    host = host.format(port=port(gateway.agent_url))
    for origin in (None, "http://127.0.0.1:5173", f"https://{ALLOWED}"):
        headers = {"Host": host} | ({"Origin": origin} if origin else {})
        assert request(gateway, "GET", "/decisions", headers).status_code == 200
    assert "Origin" in assert_error_body(request(gateway, "GET", "/decisions", {"Host": host, "Origin": f"http://{host}"}), 403)


def test_a_request_without_host_is_no_browser_s_and_is_served(gateway: served.ServedGateway) -> None:
    with connect(gateway.agent_url) as sock:
        sock.sendall(b"GET /decisions HTTP/1.0\r\n\r\n")
        assert read_to_close(sock).startswith(b"HTTP/1.1 200 ")


def test_a_refusal_leaves_the_connection_closed(gateway: served.ServedGateway) -> None:
    with connect(gateway.agent_url) as sock:
        refused = f"GET /decisions HTTP/1.1\r\nHost: {REBOUND}\r\n\r\n".encode()
        sock.sendall(refused + b"GET /decisions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        response = read_to_close(sock)
    assert response.startswith(b"HTTP/1.1 421 ") and response.count(b"HTTP/1.1 ") == 1


def test_the_public_server_answers_any_name(gateway: served.ServedGateway) -> None:
    rebound = f"{REBOUND}:{port(gateway.public_url)}"
    headers = {"Host": rebound, "Origin": f"https://{REBOUND}"}
    assert httpx.get(f"{gateway.public_url}/jwks.json", headers=headers, timeout=CALL_TIMEOUT_S).status_code == 200


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_the_mcp_clients_reach_it_at_the_agent_s_url(gateway: served.ServedGateway, transport: str) -> None:
    """The URL the agent is given ($AGENT_SERVER_URL, http://127.0.0.1:PORT; the sandbox's relay
    keeps the bytes, Host included), with the SDK's client and through ``agent-gateway mcp``."""
    async with mcp_connect(gateway, transport) as client:
        assert isinstance(succeeded(await client.call_tool("list_users", {}))["users"], list)


@pytest.mark.parametrize("value", ['["gateway.internal:8701"]', '["http://gateway.internal"]', '["a b"]', '[""]', "x"])
def test_allowed_hosts_are_names_or_addresses_without_a_port(tmp_path: Path, value: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text("[auth]\ntoken_ttl_ms = 1000\n", encoding="utf-8")
    with pytest.raises(config.SettingsError, match="agent.allowed_hosts"):
        config.load(path, environ={"AGENT_GATEWAY_AGENT_ALLOWED_HOSTS": value})


def test_allowed_hosts_are_read_as_lower_case_names(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    allowed = '["Gateway.Internal", "[fd00::5]", "10.0.0.5"]'
    path.write_text(f"[auth]\ntoken_ttl_ms = 1000\n[agent]\nallowed_hosts = {allowed}\n", encoding="utf-8")
    assert config.load(path, environ={}).agent_allowed_hosts == ("gateway.internal", "fd00::5", "10.0.0.5")
