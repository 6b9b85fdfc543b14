"""TLS: every endpoint's certificate is checked, even where two endpoints' names resolve to one
address and port, whose connections a pool keyed by address would share."""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import certifi
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent_gateway.webhooks.sender import Sender


def _certificate(subject: str, issuer: x509.Name, public_key, signer, *, ca: bool) -> x509.Certificate:  # type: ignore[no-untyped-def]
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
    return builder.sign(signer, hashes.SHA256())


class TlsServer:
    """An HTTPS server on a loopback port whose certificate names ``a.test`` only, issued by a CA of
    the test's own; it answers 204, keeps connections open, and counts the requests and connections."""

    def __init__(self, directory: Path) -> None:
        ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        ca = _certificate("test CA", x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")]),
                          ca_key.public_key(), ca_key, ca=True)
        leaf = _certificate("a.test", ca.subject, key.public_key(), ca_key, ca=False)
        self.ca_file = directory / "ca.pem"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        chain = directory / "server.pem"
        chain.write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ))
        self.hosts: list[str] = []
        self.connections = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                server.connections += 1
                super().setup()

            def do_POST(self) -> None:  # http.server's name
                self.rfile.read(int(self.headers.get("content-length", "0")))
                server.hosts.append(self.headers["host"])
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(chain)
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # The handshake happens at accept; one the client abandons (a refused certificate) is dropped.
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def tls_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TlsServer]:
    """The server, its CA the one the sender trusts (in place of the public ones), and every name
    resolving to its loopback address."""
    server = TlsServer(tmp_path)
    monkeypatch.setattr(certifi, "where", lambda: str(server.ca_file))

    async def loopback(self, url, allow_private):  # type: ignore[no-untyped-def]
        return ipaddress.ip_address("127.0.0.1")

    monkeypatch.setattr(Sender, "_resolve", loopback)
    try:
        yield server
    finally:
        server.close()


async def test_a_name_the_certificate_does_not_name_is_refused(tls_server: TlsServer) -> None:
    out = Sender(timeout_s=60)
    try:
        error = await out.post(f"https://b.test:{tls_server.port}/hook", b"{}", {}, allow_private=True)
    finally:
        await out.close()
    assert error is not None and "CERTIFICATE_VERIFY_FAILED" in error
    assert tls_server.hosts == []


async def test_a_connection_verified_for_one_name_is_never_reused_for_another(tls_server: TlsServer) -> None:
    out = Sender(timeout_s=60)
    try:
        for _ in range(2):  # the second reuses the first's connection: the same name's pool
            assert await out.post(f"https://a.test:{tls_server.port}/hook", b"{}", {}, allow_private=True) is None
        # Same address and port, another name: a connection of its own, whose certificate does not name it.
        error = await out.post(f"https://b.test:{tls_server.port}/hook", b"{}", {}, allow_private=True)
    finally:
        await out.close()
    assert error is not None and "CERTIFICATE_VERIFY_FAILED" in error
    assert tls_server.hosts == [f"a.test:{tls_server.port}"] * 2
    assert tls_server.connections == 1
