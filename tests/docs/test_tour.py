"""The tour (docs/start/tour.md) as a newcomer takes it: every shell block of the page, in
order, run by bash against a real ``serve`` of an ``init --demo-user`` deployment.

The page's blocks are run as written, with two substitutions only: the default addresses
of the two servers become the free ports this test serves on. Variables a block sets are
carried to the next blocks, as in one terminal. The block that follows the live stream
runs in the background, as in the page's third terminal, and is stopped once it has shown
the agent's answer.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import served
from tests.docs import pages

pytestmark = pytest.mark.e2e

TOUR = pages.DOCS / "start" / "tour.md"
ANSWER_DEADLINE_S = 300  # a ceiling for a broken build, never an expectation


def tour_blocks() -> list[str]:
    return list(pages.shell_blocks(TOUR.read_text()))


def run_block(block: str, env: dict[str, str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """Run one block in bash with ``env``; what it printed, and the environment it leaves
    (every variable it set, as ``set -a`` exports them)."""
    after = cwd / ".tour-env"
    script = f"set -a -euo pipefail\n{block}\nenv -0 > {shlex.quote(str(after))}\n"
    result = subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{block}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    left = dict(item.split("=", 1) for item in after.read_text().split("\0") if "=" in item)
    return result, left


def test_the_tour_runs_as_written(tmp_path: Path, database_url: str) -> None:
    directory = tmp_path / "demo"
    serve_env, _ = served.init_demo(directory, database_url)
    # Ports of its own, picked again should another test take one between pick and bind.
    gateway = served.ServedGateway.spawn_on_free_ports(directory, serve_env)
    stream: subprocess.Popen[str] | None = None
    try:
        # A terminal in the clone's folder, with agent-gateway installed and reaching this
        # deployment's database (its URL comes from the environment, as serve's does).
        env = served.cli_env(directory / "gateway.toml", gateway.env)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        outputs: list[str] = []
        streamed: list[str] = []
        for block in tour_blocks():
            block = block.replace("http://127.0.0.1:8700", gateway.public_url)
            block = block.replace("http://127.0.0.1:8701", gateway.agent_url)
            if "/messages/stream" in block:
                stream = subprocess.Popen(
                    ["bash", "-c", f"set -euo pipefail\n{block}"],
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
                reader = threading.Thread(target=lambda: streamed.extend(stream.stdout), daemon=True)
                reader.start()
                continue
            result, env = run_block(block, env, tmp_path)
            outputs.append(result.stdout)

        # Step 3's stream shows the inbound Message and the echo agent's answer.
        deadline = time.monotonic() + ANSWER_DEADLINE_S
        while not any("echo: Hello, agent" in line for line in streamed):
            assert time.monotonic() < deadline, "".join(streamed) + gateway.output()
            assert stream is not None and stream.poll() is None, "".join(streamed)
            time.sleep(0.05)
        events = [json.loads(line[len("data: ") :]) for line in streamed if line.startswith("data: ")]
        assert [(e["direction"], e["text"]) for e in events][:2] == [
            ("inbound", "Hello, agent"),
            ("outbound", "echo: Hello, agent"),
        ]
    finally:
        if stream is not None:
            served.stop_process(stream)  # type: ignore[arg-type]
            reader.join(60)  # the pipe ends with the process
            stream.stdout.close()  # type: ignore[union-attr]
        gateway.stop()

    setup, login, send, publish, verify, offline, audit, schedules = map(json_values, outputs)
    assert setup == [] and publish == []  # they set variables, and print nothing
    credentials = json.loads((directory / "demo-user.json").read_text())
    assert login[0]["id"] == credentials["user"]  # GET /users/me
    assert send[0]["text"] == "Hello, agent"
    assert verify[0]["verified"] is True
    assert verify[0]["payload"]["statement"] == "Release 4.2 ships Friday"
    assert offline[0]["verified"] is True
    assert audit[0]["audited"] >= 1
    follow_up, standup, listed = schedules
    assert (follow_up["name"], standup["name"]) == ("follow-up", "standup")
    assert {schedule["name"] for schedule in listed} == {"follow-up", "standup"}


def json_values(text: str) -> list:
    """The JSON values printed one after the other (curl -s ends none with a newline)."""
    decoder = json.JSONDecoder()
    values, at = [], 0
    while (at := len(text) - len(text[at:].lstrip())) < len(text):
        value, at = decoder.raw_decode(text, at)
        values.append(value)
    return values
