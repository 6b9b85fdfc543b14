"""A request's body must arrive within ``http.body_timeout_ms`` of its headers, on real sockets
against a real ``serve``: past it, ``408`` with the JSON error body, and the connection closed.

The timeout is set short here so that the tests wait little; every wait has a ceiling
of minutes, and no test asserts how fast anything happened.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

from tests import served
from tests.http.test_connections import CEILING_S, connect, error_of, exchange, read_to_close

pytestmark = pytest.mark.e2e

SHORT = {"AGENT_GATEWAY_HTTP_BODY_TIMEOUT_MS": "1000"}
# A route of each server that reads a JSON body, and no credential: anybody can hold its connection.
POSTS = {"public": "/auth/tokens", "agent": "/sign"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, module_database_url: str) -> Iterator[served.ServedGateway]:
    with served.ServedGateway.start(tmp_path_factory.mktemp("deployment"), module_database_url, env=SHORT) as gateway:
        yield gateway


@pytest.fixture(params=["public", "agent"])
def server(request: pytest.FixtureRequest, gateway: served.ServedGateway) -> tuple[str, str]:
    """The URL of one server and the path of its POST."""
    url = gateway.public_url if request.param == "public" else gateway.agent_url
    return url, POSTS[request.param]


def head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def test_a_body_that_never_comes_is_408(server: tuple[str, str]) -> None:
    url, path = server
    status, error = error_of(exchange(url, head(path, 10)))
    assert status == 408 and "body" in error["message"]


def test_a_body_sent_a_byte_at_a_time_is_408(server: tuple[str, str]) -> None:
    """One byte every 0.2 s of a 100,000-byte body: each byte is progress, and none resets the clock."""
    url, path = server
    with connect(url) as sock:
        sock.sendall(head(path, 100_000) + b"{")
        deadline = time.monotonic() + CEILING_S
        received = b""
        while time.monotonic() < deadline:
            try:
                sock.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                break
            sock.settimeout(0.2)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        sock.settimeout(CEILING_S)
        with contextlib.suppress(OSError):
            received += read_to_close(sock)
    status, _ = error_of(received)
    assert status == 408


def test_a_whole_request_is_served_and_the_connection_serves_the_next(server: tuple[str, str]) -> None:
    url, path = server
    nobody = b'{"user": "00000000-0000-4000-8000-000000000000", "password": "p"}'
    body = b'{"statement": "s"}' if path == "/sign" else nobody
    with connect(url) as sock:
        for _ in range(2):
            sock.sendall(head(path, len(body)) + body)
            response = b""
            while b"\r\n\r\n" not in response:
                response += sock.recv(65536)
            assert response.split(b" ", 2)[1] in (b"200", b"401")  # signed, or a login nobody holds
            lines = response.partition(b"\r\n\r\n")[0].split(b"\r\n")
            [length] = [int(line.split(b": ")[1]) for line in lines if line.startswith(b"content-length")]
            while len(response.partition(b"\r\n\r\n")[2]) < length:
                response += sock.recv(65536)
            time.sleep(1.5)  # longer than the body timeout: a connection waiting for its next request is not due
