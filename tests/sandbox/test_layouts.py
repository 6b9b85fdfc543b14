"""The quickstart's demo echo agent runs confined in every role layout: one serve with
``http.workers = 2`` (both backends), and an api process beside a worker-only process on PostgreSQL
(the worker's relay reaches the Agent server in the other process)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import served
from tests.sandbox.conftest import ANSWER_DEADLINE_S, Conversation

# A worker process beside the api one: its ops listener off, so that it binds nothing of the api's.
WORKER_OPS_OFF = {"AGENT_GATEWAY_OPS_LISTEN": ""}

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("bwrap")]

CONFINED = "INFO agent_gateway.sandbox.choose: the agent program runs confined by bubblewrap"


def confined_children(pid: int) -> list[str]:
    """The names of ``pid``'s child processes (the confined agent's is bwrap)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [Path(f"/proc/{child}/comm").read_text().strip() for child in children]


def test_the_quickstart_echo_agent_answers_confined_with_two_http_processes(database_url: str, tmp_path: Path) -> None:
    env = {"AGENT_GATEWAY_HTTP_WORKERS": "2", "AGENT_GATEWAY_RUNTIME_SANDBOX": "bubblewrap"}
    with served.ServedGateway.start(tmp_path / "deployment", database_url, env) as gateway:
        conversation = Conversation(gateway)
        for n in range(4):  # answered whichever HTTP process takes each of the agent's connections
            conversation.say(f"hello {n}")
            assert conversation.answer() == f"echo: hello {n}"
        assert CONFINED in gateway.output()
        assert "bwrap" in confined_children(gateway.process.pid)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_worker_process_confines_the_agent_and_relays_to_the_api_process(database_url: str, tmp_path: Path) -> None:
    directory = tmp_path / "deployment"
    assert served.run_cli("init", str(directory), config=directory / "gateway.toml").returncode == 0
    env = {
        "AGENT_GATEWAY_DATABASE_URL": database_url,
        "AGENT_GATEWAY_AUTH_SCRYPT_LOGN": "10",
        "AGENT_GATEWAY_RUNTIME_SANDBOX": "bubblewrap",
    }
    api = served.ServedGateway.spawn_on_free_ports(directory, env, ("--role", "api"))
    worker: subprocess.Popen[bytes] | None = None
    log = directory / "worker.log"
    try:
        with open(log, "wb") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "agent_gateway", "serve", "--role", "worker"],
                env=served.cli_env(api.config, {**api.env, **WORKER_OPS_OFF}), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        conversation = Conversation(api)
        conversation.say("from far away")
        assert conversation.answer() == "echo: from far away"
        assert CONFINED in log.read_text()
        assert CONFINED not in api.output()  # an api process runs no agent, and checks nothing
        deadline = time.monotonic() + ANSWER_DEADLINE_S
        while "bwrap" not in confined_children(worker.pid):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        if worker is not None:
            served.stop_process(worker)
        api.stop()
