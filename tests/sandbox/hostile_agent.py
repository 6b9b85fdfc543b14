"""A hostile agent program: what a prompt-injected agent with a shell tool would try.

Run under either runtime through the kit (``agent_gateway.agent.serve``). Its
Prompt is the demo template's (``A message from user <id>:`` and the User's
words), the words being JSON: the targets of each escape (the gateway's key,
config, database and folder, its pid, addresses to connect to, a path to
write). It tries each, and answers the User, through the Agent server, with
``{"escapes": {name: "refused: ..." | "ESCAPED: ..."}}``: an answer arriving at
all shows that its Agent-server calls succeed.
"""

import json
import os
import socket
import sys

from agent_gateway.agent import Client, Run, serve

CONNECT_TIMEOUT_S = 5


def attempt(name, try_it, escapes):
    """Record ``try_it()``'s outcome: what it got is an escape, an OSError a refusal."""
    try:
        got = try_it()
    except OSError as exc:
        escapes[name] = f"refused: {exc}"
        return
    escapes[name] = f"ESCAPED: {got}" if got else f"refused: nothing there ({got!r})"


def read(path):
    with open(path, "rb") as file:
        return file.read()[:40]


def connect(address):
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
        return f"connected to {address}"


def write(path):
    with open(path, "w") as file:
        file.write("the agent was here")
    return f"wrote {path}"


def environ(pid):
    return read(f"/proc/{pid}/environ")


def kill(pid):
    os.kill(pid, 0)  # permission to signal, without harming the gateway should it escape
    return f"may signal {pid}"


def listing(path):
    secrets = {"signing-key.pem", "gateway.toml", "gateway.db"}
    return sorted(set(os.listdir(path)) & secrets)


def handle(run: Run, client: Client) -> None:
    header, _, words = run.prompt.partition("\n\n")
    user = run.session.removeprefix("user_")
    targets = json.loads(words)
    escapes = {}
    for name in ("key", "config", "database"):
        if targets.get(name):
            attempt(f"read the {name}", lambda: read(targets[name]), escapes)
    for name, address in targets["connect"].items():
        attempt(f"connect to {name}", lambda: connect(address), escapes)
    attempt("write outside the Workspace", lambda: write(targets["outside"]), escapes)
    attempt("read the gateway's environment", lambda: environ(targets["pid"]), escapes)
    attempt("signal the gateway", lambda: kill(targets["pid"]), escapes)
    attempt("list the gateway's folder", lambda: listing(targets["folder"]), escapes)
    attempt("see the gateway's process", lambda: [p for p in os.listdir("/proc") if p == str(targets["pid"])], escapes)
    write("written-by-the-agent")  # its Workspace, the working directory: this must work
    client.send_message(user, json.dumps({"escapes": escapes}))


if __name__ == "__main__":
    sys.exit(serve(handle))
