"""runtime.sandbox: "none" runs the agent unconfined, saying so once; "auto" without bwrap runs
only the bundled echo demo unconfined (with the warning) and refuses any other agent; "bubblewrap"
without bwrap, and a sandbox that cannot start (a bind path that does not exist), stop serve with one
line before any Run; egress through the proxy from inside the sandbox."""

from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import served
from tests.sandbox.conftest import Conversation, agent_env

pytestmark = pytest.mark.processes

# PATH without bwrap (the gateway and its agent are started by absolute path).
NO_BWRAP = {"PATH": "/nonexistent"}
# The bundled echo demo, as `agent-gateway init` writes it.
ECHO_DEMO = {
    "AGENT_GATEWAY_RUNTIME_COMMAND": json.dumps([sys.executable, "-m", "agent_gateway.runtimes.echo"]),
    "AGENT_GATEWAY_RUNTIME_MODE": "persistent",
}
AUTO_REFUSES = (
    'agent-gateway: error: runtime.sandbox = "auto": the agent program cannot be confined ({reason}), and only '
    "the bundled echo demo runs unconfined; install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or set "
    'runtime.sandbox = "none" to run it unconfined on purpose'
)


def hostile_targets(gateway: served.ServedGateway, deployment: Path) -> str:
    return json.dumps({
        "key": str(deployment / "signing-key.pem"),
        "config": str(deployment / "gateway.toml"),
        "connect": {"the Public server": gateway.env["AGENT_GATEWAY_PUBLIC_LISTEN"]},
        "outside": str(deployment.parent / "escaped.txt"),
        "pid": gateway.process.pid,
        "folder": str(deployment),
    })


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        ({"RUNTIME_SANDBOX": "none"}, 'INFO agent_gateway.sandbox.choose: the agent program runs unconfined (runtime.sandbox = "none")'),
    ],
    ids=["none"],
)
def test_unconfined_the_agent_has_the_gateways_rights_and_the_log_says_so_once(
    database_url: str, tmp_path: Path, settings: dict[str, str], line: str
) -> None:
    """What confinement prevents, shown by its absence: the same hostile agent reads the key."""
    deployment = tmp_path / "deployment"
    env = {**agent_env("hostile_agent.py", "per-run"), **{f"AGENT_GATEWAY_{k}" if k != "PATH" else k: v for k, v in settings.items()}}
    with served.ServedGateway.start(deployment, database_url, env) as gateway:
        conversation = Conversation(gateway)
        conversation.say(hostile_targets(gateway, deployment))
        escapes = json.loads(conversation.answer())["escapes"]
        assert escapes["read the key"].startswith("ESCAPED")
        assert escapes["connect to the Public server"].startswith("ESCAPED")
        assert escapes["signal the gateway"].startswith("ESCAPED")
        assert (tmp_path / "escaped.txt").exists()
        assert [l for l in gateway.output().splitlines() if "agent_gateway.sandbox" in l] == [
            l for l in gateway.output().splitlines() if l.endswith(line)
        ]
        assert sum(l.endswith(line) for l in gateway.output().splitlines()) == 1


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        (
            {"AGENT_GATEWAY_RUNTIME_SANDBOX": "bubblewrap", **NO_BWRAP},
            'agent-gateway: error: runtime.sandbox = "bubblewrap": the agent program cannot be confined: '
            "bwrap was not found on PATH",
        ),
        (
            {"AGENT_GATEWAY_RUNTIME_SANDBOX": "bubblewrap", "AGENT_GATEWAY_RUNTIME_SANDBOX_RO": '["/nonexistent/agent-config"]'},
            "agent-gateway: error: runtime.sandbox = \"bubblewrap\": the agent program cannot be confined: "
            "runtime.sandbox_ro: /nonexistent/agent-config does not exist",
        ),
        (
            {"AGENT_GATEWAY_RUNTIME_SANDBOX": "bubblewrap", "AGENT_GATEWAY_RUNTIME_SANDBOX_RW": '["."]'},
            "agent-gateway: error: runtime.sandbox = \"bubblewrap\": the agent program cannot be confined: "
            "runtime.sandbox_rw: {deployment} would show the agent the gateway's {deployment}/gateway.toml",
        ),
        (
            {"AGENT_GATEWAY_RUNTIME_SANDBOX": "auto", **NO_BWRAP},
            AUTO_REFUSES.format(reason="bwrap was not found on PATH"),
        ),
        (
            {"AGENT_GATEWAY_RUNTIME_SANDBOX_RO": '["/nonexistent/agent-config"]'},
            AUTO_REFUSES.format(reason="runtime.sandbox_ro: /nonexistent/agent-config does not exist"),
        ),
        (
            {"AGENT_GATEWAY_RUNTIME_SANDBOX": "bubblewrap", **NO_BWRAP, **ECHO_DEMO},
            'agent-gateway: error: runtime.sandbox = "bubblewrap": the agent program cannot be confined: '
            "bwrap was not found on PATH",
        ),
    ],
    ids=[
        "bwrap-missing", "bind-path-missing", "bind-shows-the-config", "auto-without-bwrap",
        "auto-default-bind-path-missing", "bubblewrap-even-for-the-echo-demo",
    ],
)
def test_a_sandbox_that_cannot_start_stops_serve_with_one_line(
    tmp_path: Path, settings: dict[str, str], error: str, request: pytest.FixtureRequest
) -> None:
    if "PATH" not in settings:
        request.getfixturevalue("bwrap")
    deployment = tmp_path / "deployment"
    assert served.run_cli("init", str(deployment), config=deployment / "gateway.toml").returncode == 0
    # Listeners of its own: it stops before serving, but checks its addresses first, and another
    # test may hold the default ports meanwhile.
    listeners = {name: f"127.0.0.1:{served.free_port()}" for name in served.LISTENERS}
    env = {**agent_env("hostile_agent.py", "per-run"), **listeners, **settings}
    if "AGENT_GATEWAY_RUNTIME_SANDBOX" not in settings:
        del env["AGENT_GATEWAY_RUNTIME_SANDBOX"]  # the default, "auto"
    result = served.run_cli("serve", config=deployment / "gateway.toml", env=env)
    assert result.returncode == 1
    assert result.stderr.strip() == error.format(deployment=deployment.resolve())
    assert not (deployment / "gateway.db-wal").exists()  # it stopped before serving anything


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        (NO_BWRAP, "bwrap was not found on PATH"),
        ({"AGENT_GATEWAY_RUNTIME_SANDBOX_RO": '["/nonexistent/agent-config"]'},
         "runtime.sandbox_ro: /nonexistent/agent-config does not exist"),
    ],
    ids=["without-bwrap", "sandbox-cannot-start"],
)
def test_auto_runs_the_echo_demo_unconfined_with_the_reason_once(
    database_url: str, tmp_path: Path, settings: dict[str, str], reason: str, request: pytest.FixtureRequest
) -> None:
    """A fresh machine without bubblewrap: the quickstart's echo demo still answers, and says why it is unconfined."""
    if "PATH" not in settings:
        request.getfixturevalue("bwrap")
    with served.ServedGateway.start(tmp_path / "deployment", database_url, {**ECHO_DEMO, **settings}) as gateway:
        conversation = Conversation(gateway)
        conversation.say("hello")
        assert conversation.answer() == "echo: hello"
        line = (
            "WARNING agent_gateway.sandbox.choose: the agent program runs UNCONFINED, with the gateway's rights: "
            f"{reason}; install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or set runtime.sandbox = \"none\""
        )
        assert sum(l.endswith(line) for l in gateway.output().splitlines()) == 1


class _Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"upstream"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[int]:
    """A local HTTP server (tests have no internet): the LLM API an agent would call."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("mode", ["per-run", "persistent"])
def test_a_listed_host_is_reached_through_the_proxy_and_nothing_else(
    bwrap: str, database_url: str, tmp_path: Path, upstream: int, mode: str
) -> None:
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        other = spare.getsockname()[1]
    env = agent_env("trying_agent.py", mode, allow_hosts=[f"127.0.0.1:{upstream}"])
    with served.ServedGateway.start(tmp_path / "deployment", database_url, env) as gateway:
        conversation = Conversation(gateway)
        conversation.say(f"egress http://127.0.0.1:{upstream}/v1/models http://127.0.0.1:{other}/")
        outcome = json.loads(conversation.answer())
        assert outcome["allowed"] == "200 upstream"
        assert outcome["other"].startswith("403 ")
        assert outcome["direct"] == "error: ConnectError"  # the sandbox's network has no way out but the proxy
        assert outcome["proxy"].startswith("http://127.0.0.1:")
        assert f"egress refused: 127.0.0.1:{other} is not in runtime.allow_hosts" in gateway.output()
        metrics = served.httpx.get(f"{gateway.ops_url}/metrics").text
        assert "agent_gateway_sandbox_egress_refused_total 1.0" in metrics


def test_the_confined_agent_gets_a_minimal_environment_and_the_names_of_env_pass(
    bwrap: str, database_url: str, tmp_path: Path
) -> None:
    env = {
        **agent_env("trying_agent.py", "per-run", env_pass=["OPENAI_API_KEY"]),
        "OPENAI_API_KEY": "sk-for-the-agent",
        "PGPASSWORD": "for-the-gateway-only",
        "LC_ALL": "C.UTF-8",
    }
    deployment = tmp_path / "deployment"
    with served.ServedGateway.start(deployment, database_url, env) as gateway:
        conversation = Conversation(gateway)
        conversation.say("environment")
        seen = json.loads(conversation.answer())
    assert seen["OPENAI_API_KEY"] == "sk-for-the-agent"
    assert seen["LC_ALL"] == "C.UTF-8"
    assert seen["HOME"] == str((deployment / "workspace").resolve())
    assert seen["AGENT_SERVER_URL"] == f"http://{gateway.env['AGENT_GATEWAY_AGENT_LISTEN']}"
    assert "PGPASSWORD" not in seen and "HTTP_PROXY" not in seen  # no egress listed: no proxy
    assert sorted(name for name in seen if name.startswith("AGENT_GATEWAY_")) == [
        "AGENT_GATEWAY_RUN_ID", "AGENT_GATEWAY_SESSION", "AGENT_GATEWAY_SIGNAL_ID",
    ]
