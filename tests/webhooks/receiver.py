"""A real webhook receiver for the tests: an HTTP server on a free loopback port, in a thread.

Every request's signature is verified with the ``standardwebhooks`` library,
as a receiver would; one that does not verify is recorded as such and answered 401.
A test sets what it answers (``fail_first``: that many 500s first), can hold
requests open (``hold``) and reads what arrived (``received``), and whether
one delivery was ever being received twice at once (``overlapped``).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import http.server
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

# A ceiling for waiting on what the gateway sends, not an expectation.
WAIT_S = 240


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


@dataclasses.dataclass(frozen=True)
class Received:
    id: str
    headers: dict[str, str]
    body: bytes
    verified: bool
    status: int

    @property
    def payload(self) -> Any:
        return orjson.loads(self.body)


class Receiver:
    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.received: list[Received] = []
        self.fail_first = 0
        self.hold = threading.Event()
        self.hold.set()  # set: answer at once
        self.holding = threading.Event()  # set while a request is held
        self.delay_s = 0.0
        # Instead of 204: this status, these extra headers and this body for every request.
        self.answer: tuple[int, dict[str, str], bytes] | None = None
        self.overlapped: list[str] = []
        self._in_flight: set[str] = set()
        self._lock = threading.Condition()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {key.lower(): value for key, value in self.headers.items()}
                status = receiver._receive(headers, body)
                extra, content = {}, b""
                if receiver.answer is not None and status == receiver.answer[0]:
                    _, extra, content = receiver.answer
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                try:
                    self.wfile.write(content)
                except OSError:  # the gateway stopped reading (its response-size cap)
                    pass

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def _receive(self, headers: dict[str, str], body: bytes) -> int:
        try:
            Webhook(self.secret).verify(body, headers)
            verified = True
        except WebhookVerificationError:
            verified = False
        message_id = headers.get("webhook-id", "")
        with self._lock:
            if message_id in self._in_flight:
                self.overlapped.append(message_id)
            self._in_flight.add(message_id)
        try:
            if not self.hold.is_set():
                self.holding.set()
                self.hold.wait()
            if self.delay_s:
                time.sleep(self.delay_s)
            with self._lock:
                if not verified:
                    status = 401
                elif self.fail_first > 0:
                    self.fail_first -= 1
                    status = 500
                else:
                    status = 204 if self.answer is None else self.answer[0]
                self.received.append(Received(message_id, headers, body, verified, status))
                self._lock.notify_all()
            return status
        finally:
            with self._lock:
                self._in_flight.discard(message_id)

    def accepted(self) -> list[Received]:
        """The requests answered 2xx, in arrival order."""
        with self._lock:
            return [r for r in self.received if 200 <= r.status < 300]

    def wait_for(self, count: int, *, accepted: bool = True, timeout: float = WAIT_S) -> list[Received]:
        """Wait until ``count`` requests (2xx ones with ``accepted``) have arrived; return them all."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                found = [r for r in self.received if not accepted or 200 <= r.status < 300]
                if len(found) >= count:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"{len(found)} of {count} webhook requests arrived: "
                        f"{[(r.status, r.payload.get('type')) for r in self.received]}"
                    )
                self._lock.wait(remaining)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.hold.set()
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def running(secret: str | None = None) -> Iterator[Receiver]:
    receiver = Receiver(secret or new_secret())
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.close()
