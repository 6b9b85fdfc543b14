"""The webhooks page's receiver example is run as written, and receives and verifies a delivery."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from agent_gateway import config
from agent_gateway.gateway import Gateway
from tests import served
from tests.webhooks.conftest import with_endpoints
from tests.webhooks.receiver import WAIT_S, new_secret

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operate" / "webhooks.md"


def receiver_example() -> str:
    text = PAGE.read_text()
    match = re.search(r"<!-- receiver example -->\n```python\n(.*?)```", text, re.DOTALL)
    assert match, "the page has no receiver example"
    return match.group(1)


async def test_the_receiver_example_verifies_a_delivery(settings: config.Settings, tmp_path: Path) -> None:
    script = tmp_path / "receiver.py"
    script.write_text(receiver_example())
    secret, port = new_secret(), served.free_port()
    output, log = tmp_path / "out.txt", tmp_path / "log.txt"  # what it prints; http.server's request log
    with open(output, "wb") as out, open(log, "wb") as err:
        process = subprocess.Popen(
            [sys.executable, str(script)], env={**os.environ, "WEBHOOK_SECRET": secret, "PORT": str(port)},
            stdout=out, stderr=err, start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/hooks"
    good = config.WebhookEndpoint(url, frozenset({"decision.published"}), secret, allow_private=True)
    # A second endpoint on the same receiver with another secret: its deliveries must be refused.
    bad = config.WebhookEndpoint(url + "?other", frozenset({"decision.published"}), new_secret(), allow_private=True)
    gateway = Gateway(with_endpoints(settings, good, bad))
    await gateway.start()
    try:
        decision = await gateway.publisher.publish("read by the example")
        deadline = time.monotonic() + WAIT_S
        refused = '"POST /hooks?other HTTP/1.1" 401'
        while not ("decision.published" in output.read_text() and refused in log.read_text()):
            assert time.monotonic() < deadline, (output.read_text(), log.read_text())
            assert process.poll() is None, log.read_text()
            await asyncio.sleep(0.1)
        lines = output.read_text().splitlines()
        assert [line.split(" ", 1)[0] for line in lines] == ["decision.published"]  # the forged one refused
        assert '"statement": "read by the example"' in lines[0] and str(decision.seq) in lines[0]
    finally:
        await gateway.stop()
        served.stop_process(process)  # type: ignore[arg-type]
