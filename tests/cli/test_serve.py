"""``agent-gateway serve`` end to end: a real process on free ports (gateway.py, cli/main.py)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import served

pytestmark = pytest.mark.e2e


def listening_line(output: str, server: str, url: str) -> bool:
    return any(line.endswith(f"{server} server listening on {url}") for line in output.splitlines())


def assert_released(url: str) -> None:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))


def test_both_servers_answer_then_sigterm_is_a_clean_exit(served_gateway: served.ServedGateway) -> None:
    gateway = served_gateway
    agent = httpx.get(f"{gateway.agent_url}/openapi.json", timeout=120)
    public = httpx.get(f"{gateway.public_url}/openapi.json", timeout=120)
    assert agent.status_code == public.status_code == 200
    assert agent.json()["info"]["title"] == "agent-gateway: Agent server"
    assert public.json()["info"]["title"] == "agent-gateway: Public server"
    assert "server" not in agent.headers  # uvicorn's Server header is off
    # The process serves on uvloop's event loop (its extension module is mapped).
    assert "uvloop/loop." in Path(f"/proc/{gateway.process.pid}/maps").read_text()

    user = gateway.cli_json("users", "add")
    response = httpx.get(f"{gateway.agent_url}/users/{user['id']}", timeout=120)
    assert response.status_code == 200 and response.json() == user
    assert httpx.get(f"{gateway.agent_url}/users", timeout=120).json() == {"users": [user]}
    # The conventions hold over real sockets too.
    refused = httpx.get(f"{gateway.agent_url}/users", params={"page": "2"}, timeout=120)
    assert refused.status_code == 400 and set(refused.json()) == {"statusCode", "error", "message"}
    missing = httpx.get(f"{gateway.public_url}/users/{user['id']}", timeout=120)
    assert missing.status_code == 404 and missing.json()["error"] == "Not Found"

    assert gateway.stop(signal.SIGTERM) == 0
    output = gateway.output()
    assert listening_line(output, "Public", gateway.public_url), output
    assert listening_line(output, "Agent", gateway.agent_url), output
    assert "not loopback" not in output
    assert "Traceback" not in output and "ERROR" not in output, output
    assert_released(gateway.public_url)
    assert_released(gateway.agent_url)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    # serve migrates a fresh database itself; these cases do not depend on the backend.
    return f"sqlite:///{tmp_path / 'gateway.db'}"


def test_an_agent_server_off_loopback_is_warned_about_and_sigint_stops(tmp_path: Path, sqlite_url: str) -> None:
    listen = f"0.0.0.0:{served.free_port()}"
    with served.ServedGateway.start(tmp_path / "d", sqlite_url, {"AGENT_GATEWAY_AGENT_LISTEN": listen}) as gateway:
        assert httpx.get(f"{gateway.agent_url}/users", timeout=120).status_code == 200
        assert gateway.stop(signal.SIGINT) == 0
    warnings = [line for line in gateway.output().splitlines() if "WARNING" in line and "not loopback" in line]
    assert len(warnings) == 1 and listen in warnings[0], gateway.output()
    assert "no authentication" in warnings[0]


@pytest.fixture
def occupied_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("server", ["PUBLIC", "AGENT"])
def test_a_port_in_use_fails_the_start(tmp_path: Path, sqlite_url: str, occupied_port: int, server: str) -> None:
    folder = tmp_path / "d"
    assert served.run_cli("init", str(folder), config=folder / "gateway.toml").returncode == 0
    other = "AGENT" if server == "PUBLIC" else "PUBLIC"
    free = served.free_port()
    env = served.cli_env(
        folder / "gateway.toml",
        {
            "AGENT_GATEWAY_DATABASE_URL": sqlite_url,
            f"AGENT_GATEWAY_{server}_LISTEN": f"127.0.0.1:{occupied_port}",
            f"AGENT_GATEWAY_{other}_LISTEN": f"127.0.0.1:{free}",
        },
    )
    # A timeout here is the failure "serve hangs instead of exiting".
    result = subprocess.run(
        [sys.executable, "-m", "agent_gateway", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "already in use" in line.lower()]
    assert len(lines) == 1 and f"127.0.0.1:{occupied_port}" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert_released(f"http://127.0.0.1:{free}")
