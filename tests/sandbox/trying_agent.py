"""An agent program that tries what the sandbox limits, as the User's words say.

Under either runtime, through the kit. The words (after the demo template's
header) are one of: ``hello`` (answers ``hello``), ``egress ALLOWED OTHER``
(fetches both ``http://`` URLs through ``$HTTP_PROXY``, and ALLOWED directly,
and answers with the outcomes as JSON), ``fork`` (starts processes until one
is refused, stops them, and fails its Run saying how many it had), ``memory``
(allocates 16 MiB blocks until refused, and fails its Run), ``environment``
(answers with its environment as JSON).
"""

import json
import os
import signal
import sys

import httpx

from agent_gateway.agent import Client, Run, serve

BLOCK_BYTES = 16 * 1024 * 1024
SLEEP_S = 600


def fetch(url, proxy):
    try:
        response = httpx.get(url, proxy=proxy, timeout=60, trust_env=False)
    except httpx.HTTPError as exc:
        return f"error: {type(exc).__name__}"
    return f"{response.status_code} {response.text.strip()}"


def fork():
    children = []
    try:
        while True:
            pid = os.fork()
            if pid == 0:
                os.execvp("sleep", ["sleep", str(SLEEP_S)])
            children.append(pid)
    except OSError as exc:
        refused = f"fork refused after {len(children)} processes: {exc}"
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    raise RuntimeError(refused)


def memory():
    blocks = []
    try:
        while True:
            blocks.append(bytearray(BLOCK_BYTES))
    except MemoryError:
        allocated = len(blocks) * BLOCK_BYTES // 2**20
    blocks.clear()
    raise RuntimeError(f"allocation refused after {allocated} MiB")


def handle(run: Run, client: Client) -> None:
    user = run.session.removeprefix("user_")
    words = run.prompt.partition("\n\n")[2].split()
    if words[0] == "egress":
        proxy = os.environ.get("HTTP_PROXY")
        outcome = {
            "allowed": fetch(words[1], proxy),
            "other": fetch(words[2], proxy),
            "direct": fetch(words[1], None),
            "proxy": proxy,
        }
        client.send_message(user, json.dumps(outcome))
    elif words[0] == "environment":
        client.send_message(user, json.dumps(dict(os.environ)))
    elif words[0] == "fork":
        fork()
    elif words[0] == "memory":
        memory()
    else:
        client.send_message(user, "hello")


if __name__ == "__main__":
    sys.exit(serve(handle))
