"""Connection-level limits of both servers, on real sockets against a real ``serve``.

Timeouts are set short here so that the tests wait little; every wait has a
ceiling of minutes, and no test asserts how fast anything happened.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from agent_gateway.http import connections
from agent_gateway.sandbox import proxy
from tests import served
from tests.flood import Flood

pytestmark = pytest.mark.e2e

CEILING_S = 180
SHORT = {
    "AGENT_GATEWAY_HTTP_HEADER_TIMEOUT_MS": "1000",
    "AGENT_GATEWAY_HTTP_IDLE_TIMEOUT_MS": "1000",
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, module_database_url: str) -> Iterator[served.ServedGateway]:
    """One gateway per backend for the tests that only talk to it: none changes what it serves."""
    with served.ServedGateway.start(tmp_path_factory.mktemp("deployment"), module_database_url, env=SHORT) as gateway:
        yield gateway


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def connect(url: str) -> socket.socket:
    sock = socket.create_connection(address(url), timeout=CEILING_S)
    sock.settimeout(CEILING_S)
    return sock


def exchange(url: str, request: bytes) -> bytes:
    """Send ``request`` on a new connection; read until the server closes it."""
    with connect(url) as sock:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            sock.sendall(request)
        return read_to_close(sock)


def read_to_close(sock: socket.socket) -> bytes:
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            received += chunk
    return received


def error_of(response: bytes) -> tuple[int, dict]:
    """The status and JSON error body of a whole response, checking its shape."""
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    assert headers[b"content-type"] == b"application/json"
    assert b"location" not in headers
    error = orjson.loads(body)
    assert set(error) == {"statusCode", "error", "message"} and error["statusCode"] == status
    return status, error


def is_closed_by_server(sock: socket.socket) -> bool:
    return read_to_close(sock) == b""


@pytest.fixture(params=["public", "agent"])
def url(request: pytest.FixtureRequest, gateway: served.ServedGateway) -> str:
    return gateway.public_url if request.param == "public" else gateway.agent_url


def test_http_1_1_without_exactly_one_host_is_400(url: str) -> None:
    for request in (
        b"GET /openapi.json HTTP/1.1\r\n\r\n",
        b"GET /openapi.json HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    ):
        status, error = error_of(exchange(url, request))
        assert status == 400 and "Host" in error["message"]
    # HTTP/1.0 has no Host requirement.
    response = exchange(url, b"GET /openapi.json HTTP/1.0\r\n\r\n")
    assert response.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /decisions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET /openapi.json HTTP/9.9\r\nHost: x\r\n\r\n",
        b"GET /openapi.json HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n",
        b"\x00\x01\x02 / HTTP/1.1\r\n\r\n",
    ],
    ids=["content-length-and-chunked", "version", "header-name", "binary"],
)
def test_what_the_parser_refuses_is_a_json_400(url: str, request_bytes: bytes) -> None:
    status, _ = error_of(exchange(url, request_bytes))
    assert status == 400


@pytest.mark.parametrize("path", ["/decisions/%2F", "/decisions/", "/users/", "/messages/", "/openapi.json/"])
def test_no_path_redirects(url: str, path: str) -> None:
    request = f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
    status, _ = error_of(exchange(url, request))
    assert status in (400, 404)


def test_request_headers_over_the_limit_are_431(url: str) -> None:
    huge = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + b"a" * 100_000 + b"\r\n\r\n"
    status, error = error_of(exchange(url, huge))
    assert status == 431 and "65536" in error["message"]
    # Headers that never end are refused as they arrive, not buffered.
    with connect(url) as sock:
        sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n")
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            for _ in range(200):  # 10 MB at most, one header line at a time
                sock.sendall(b"X-Filler: " + b"f" * 50_000 + b"\r\n")
        status, _ = error_of(read_to_close(sock))
        assert status == 431


def test_headers_at_the_limit_are_served(url: str) -> None:
    request = b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Filler: "
    request += b"f" * (60_000) + b"\r\n\r\n"
    assert exchange(url, request).startswith(b"HTTP/1.1 200 ")


def test_a_connection_that_sends_nothing_is_closed(url: str) -> None:
    with connect(url) as sock:
        assert is_closed_by_server(sock)


def test_headers_sent_slowly_are_closed(url: str) -> None:
    """Slowloris: one header line every 0.2 s, each resetting no clock."""
    with connect(url) as sock:
        sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n")
        deadline = time.monotonic() + CEILING_S
        closed = False
        while not closed and time.monotonic() < deadline:
            try:
                sock.sendall(b"X-Slow: y\r\n")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            sock.settimeout(0.2)
            try:
                closed = sock.recv(65536) == b""
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed = True
        assert closed


def test_an_idle_keep_alive_connection_is_closed(url: str) -> None:
    with connect(url) as sock:
        sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        response = read_to_close(sock)  # the response, then the close after the idle timeout
        assert response.startswith(b"HTTP/1.1 200 ")


def test_a_connection_kept_alive_serves_several_requests(url: str) -> None:
    with connect(url) as sock:
        for _ in range(3):
            sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(1)
            length = int(next(line.split(b": ")[1] for line in head.split(b"\r\n") if line.startswith(b"content-length")))
            body = b""
            while len(body) < length:
                body += sock.recv(length - len(body))
            assert head.startswith(b"HTTP/1.1 200 ")


def test_past_its_cap_a_server_refuses_with_503_and_the_other_answers(tmp_path: Path, database_url: str) -> None:
    env = {"AGENT_GATEWAY_PUBLIC_MAX_CONNECTIONS": "3", "AGENT_GATEWAY_HTTP_HEADER_TIMEOUT_MS": "600000"}
    with served.ServedGateway.start(tmp_path / "deployment", database_url, env=env) as gateway:
        held = [connect(gateway.public_url) for _ in range(3)]
        try:
            # The three are open once the server answers on a fourth: count them in.
            status, error = error_of(exchange(gateway.public_url, b""))
            assert status == 503 and "connection limit" in error["message"]
            assert httpx.get(f"{gateway.agent_url}/decisions", timeout=CEILING_S).status_code == 200
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + CEILING_S
        while time.monotonic() < deadline:
            response = httpx.get(f"{gateway.public_url}/jwks.json", timeout=CEILING_S)
            if response.status_code == 200:
                break
            time.sleep(0.1)
        assert response.status_code == 200
        assert "Public server up to 3 connections" in gateway.output()


def test_a_flood_of_the_public_server_leaves_the_agent_server_answering(tmp_path: Path, database_url: str) -> None:
    """3,000 idle and 500 slowloris connections on the Public server of a process limited to
    1,024 descriptors: the Agent server answers throughout, the server closes the flood, and
    both servers answer afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 4_000:
        pytest.skip(f"the test itself needs 4,000 descriptors (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        with contextlib.ExitStack() as stack:
            gateway = stack.enter_context(
                served.ServedGateway.start(
                    tmp_path / "d", database_url, {"AGENT_GATEWAY_HTTP_HEADER_TIMEOUT_MS": "2000"}, descriptors=1024
                )
            )
            assert (
                "1024 file descriptors: Public server up to 432 connections (asked for 10000, more than the "
                "descriptors allow), Agent server up to 144 connections (asked for 1000, more than the descriptors "
                "allow), 448 kept in reserve"
            ) in gateway.output()
            host, port = address(gateway.public_url)
            flood = stack.enter_context(Flood(host, port, idle=3_000, slow=500, interval_s=0.5))
            with httpx.Client(base_url=gateway.agent_url, timeout=CEILING_S) as agent:
                for _ in range(50):
                    assert agent.get("/decisions").status_code == 200
                    time.sleep(0.05)
            left = flood.wait_closed(CEILING_S)
            assert not left, f"{left} flood connections still open"
            flood.close()
            assert httpx.get(f"{gateway.agent_url}/decisions", timeout=CEILING_S).status_code == 200
            assert httpx.get(f"{gateway.public_url}/jwks.json", timeout=CEILING_S).status_code == 200
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_servers_caps_are_what_the_settings_ask_when_the_descriptors_allow() -> None:
    budget = connections.budget(20_000, 10_000, 1_000, reserved=448)
    assert (budget.public, budget.agent, budget.reserved) == (10_000, 1_000, 448)
    assert budget.describe(10_000, 1_000) == (
        "20000 file descriptors: Public server up to 10000 connections, Agent server up to 1000 connections, "
        "448 kept in reserve"
    )


@pytest.mark.parametrize("descriptors", [1_024, 2_048, 4_096, 500, 300])
def test_short_of_descriptors_the_servers_leave_the_reserve_and_the_agent_server_a_quarter(descriptors: int) -> None:
    """What a confined agent can hold through the sandbox (proxy.DESCRIPTORS) is reserved with the
    rest, so the servers' connections and the agent's together stay within the limit."""
    reserved = connections.RESERVED_DESCRIPTORS + proxy.DESCRIPTORS
    assert reserved == 256 + 2 * (64 + 32)
    budget = connections.budget(descriptors, 10_000, 1_000, reserved)
    available = max(descriptors - reserved, 2)
    assert budget.public + budget.agent <= available
    assert budget.agent == max(min(1_000, available // 4), 1) and budget.public >= 1
    assert budget.describe(10_000, 1_000).endswith(f"{reserved} kept in reserve")
