"""What the confinement tests share: a working bwrap, and a served gateway whose agent they choose.

Without bubblewrap (or without user namespaces) these tests skip with the
reason, unless ``AGENT_GATEWAY_TEST_REQUIRE_BWRAP=1`` (set by ``.ci/run``,
which installs it), where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import served

REQUIRE_BWRAP = os.environ.get("AGENT_GATEWAY_TEST_REQUIRE_BWRAP") == "1"
HERE = Path(__file__).resolve().parent
# A ceiling for a broken build, not an expectation.
ANSWER_DEADLINE_S = 300


@pytest.fixture(scope="session")
def bwrap() -> str:
    """The path of a bwrap that can confine a program here."""
    path = shutil.which("bwrap")
    if path is None:
        reason = "bwrap is not installed (apt-get install bubblewrap)"
    else:
        result = subprocess.run(
            [path, "--unshare-all", "--ro-bind", "/", "/", "true"], capture_output=True, text=True, timeout=60
        )
        reason = None if result.returncode == 0 else f"bwrap cannot confine here: {result.stderr.strip()}"
    if reason is not None:
        if REQUIRE_BWRAP:
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def agent_env(program: str, mode: str, **settings: Any) -> dict[str, str]:
    """The variables that make a served gateway run ``tests/sandbox/<program>`` confined (or as ``settings`` say)."""
    env = {
        "AGENT_GATEWAY_RUNTIME_COMMAND": json.dumps([sys.executable, str(HERE / program)]),
        "AGENT_GATEWAY_RUNTIME_MODE": mode,
        "AGENT_GATEWAY_RUNTIME_SANDBOX": "bubblewrap",
    }
    for name, value in settings.items():
        env[f"AGENT_GATEWAY_RUNTIME_{name.upper()}"] = value if isinstance(value, str) else json.dumps(value)
    return env


class Conversation:
    """One User of a served gateway: posts Messages, waits for the agent's answers."""

    def __init__(self, gateway: served.ServedGateway) -> None:
        self.gateway = gateway
        self.user = gateway.cli_json("users", "add")["id"]
        token = gateway.cli_json("tokens", "issue", self.user)["token"]
        self.headers = {"Authorization": f"Bearer {token}"}
        self.seen = 0

    def say(self, text: str) -> None:
        response = httpx.post(f"{self.gateway.public_url}/messages", json={"text": text}, headers=self.headers)
        assert response.status_code == 201, response.text
        self.seen = response.json()["seq"]

    def answer(self) -> str:
        """The agent's next outbound Message."""
        deadline = time.monotonic() + ANSWER_DEADLINE_S
        while time.monotonic() < deadline:
            response = httpx.get(
                f"{self.gateway.public_url}/messages", params={"after": self.seen}, headers=self.headers
            )
            for message in response.json()["messages"]:
                self.seen = message["seq"]
                if message["direction"] == "outbound":
                    return message["text"]
            time.sleep(0.05)
        raise AssertionError(f"no answer; the gateway's log:\n{self.gateway.output()}")

    def last_run(self) -> dict[str, Any]:
        """The Run of the last Message said, once it has ended (it is recorded only when the worker
        claims the Message's Signal, after the POST has answered)."""
        [signal] = httpx.get(f"{self.gateway.agent_url}/signals", params={"limit": 1}).json()["signals"]
        deadline = time.monotonic() + ANSWER_DEADLINE_S
        while time.monotonic() < deadline:
            runs = httpx.get(f"{self.gateway.agent_url}/runs", params={"signalId": signal["id"]}).json()["runs"]
            if runs and runs[0]["state"] in ("done", "failed"):
                return runs[0]
            time.sleep(0.05)
        raise AssertionError(f"no Run ended; the gateway's log:\n{self.gateway.output()}")
