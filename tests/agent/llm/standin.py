"""A local server speaking the OpenAI Chat Completions API: it STANDS IN FOR THE MODEL PROVIDER
(a paid outside service) in the tests of the provider's HTTP path. Real HTTP on a real socket.

It answers ``POST /v1/chat/completions`` as a model would: to a Prompt ``A message from user
ID:\\n\\nTEXT`` with a ``send_message`` tool call, then, given the tool's result, with a final text.
Words in TEXT make it fail as providers do:

- ``[429]``: always 429 (rate limited, ``Retry-After: 0``); ``[429 once]``: 429 to the first try only;
- ``[500]``: always 500;
- ``[slow]``: answers after ``SLOW_S`` seconds, past the agent's timeout;
- ``[revoked]``: 401, quoting the API key it was sent, as OpenAI does ("Incorrect API key provided").

A request without ``Authorization: Bearer <key>`` is refused with 401 too.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

MESSAGE = re.compile(r"A message from user (?P<user>\S+):\n\n(?P<text>.*)", re.S)
SLOW_S = 5.0


class StandIn:
    def __init__(self, key: str) -> None:
        self.key = key
        self.requests: list[dict[str, Any]] = []  # path, authorized, body of each request
        self._tries: dict[str, int] = {}
        self._lock = threading.Lock()

    def answer(self, path: str, authorization: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        """Status, headers and JSON body for one request."""
        presented = authorization.removeprefix("Bearer ")
        with self._lock:
            self.requests.append({"path": path, "authorized": presented == self.key, "body": body})
        if path != "/v1/chat/completions":
            return 404, {}, {"error": {"message": "not found", "type": "invalid_request_error"}}
        last = body["messages"][-1]
        prompt = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
        text = MESSAGE.fullmatch(prompt)["text"] if MESSAGE.fullmatch(prompt) else prompt
        with self._lock:
            tries = self._tries[prompt] = self._tries.get(prompt, 0) + 1
        if presented != self.key or "[revoked]" in text:
            return 401, {}, {"error": {"message": f"Incorrect API key provided: {presented}.",
                                       "type": "invalid_request_error", "code": "invalid_api_key"}}
        if "[429]" in text or ("[429 once]" in text and tries == 1):
            return 429, {"Retry-After": "0"}, {"error": {"message": "Rate limit reached", "type": "requests",
                                                          "code": "rate_limit_exceeded"}}
        if "[500]" in text:
            return 500, {}, {"error": {"message": "The server had an error", "type": "server_error"}}
        if "[slow]" in text:
            time.sleep(SLOW_S)
        if last["role"] == "tool":
            return 200, {}, _completion({"role": "assistant", "content": "answered"}, "stop")
        turns = sum(1 for m in body["messages"] if m["role"] == "user")
        call = {
            "id": f"call_{len(self.requests)}",
            "type": "function",
            "function": {
                "name": "send_message",
                "arguments": json.dumps({"userId": MESSAGE.fullmatch(prompt)["user"],
                                         "text": f"provider says: {text} (Prompts seen: {turns})"}),
            },
        }
        return 200, {}, _completion({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls")


def _completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "standin",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


@contextlib.contextmanager
def serving(key: str) -> Iterator[tuple[StandIn, str]]:
    """The stand-in on a free loopback port, and its base URL (``http://127.0.0.1:PORT/v1``)."""
    standin = StandIn(key)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            status, headers, answer = standin.answer(self.path, self.headers.get("Authorization", ""), body)
            data = json.dumps(answer).encode()
            try:
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the agent gave up waiting ([slow])
                pass

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield standin, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
