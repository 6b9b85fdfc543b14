"""``serve --role`` and the one-``serve``-per-SQLite-file rule, with real processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests import served

# A worker process beside the api one: its ops listener off, so that it binds nothing of the api's.
WORKER_OPS_OFF = {"AGENT_GATEWAY_OPS_LISTEN": ""}

pytestmark = pytest.mark.e2e

DEADLINE_S = 300


def _deployment(directory: Path, database_url: str) -> dict[str, str]:
    init = served.run_cli("init", str(directory), config=directory / "gateway.toml")
    assert init.returncode == 0, init.stderr
    return {
        "AGENT_GATEWAY_DATABASE_URL": database_url,
        "AGENT_GATEWAY_AUTH_SCRYPT_LOGN": "10",
    }


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_second_serve_on_one_sqlite_file_is_refused(tmp_path: Path, database_url: str) -> None:
    with served.ServedGateway.start(tmp_path / "deployment", database_url) as first:
        other_ports = {
            "AGENT_GATEWAY_PUBLIC_LISTEN": f"127.0.0.1:{served.free_port()}",
            "AGENT_GATEWAY_AGENT_LISTEN": f"127.0.0.1:{served.free_port()}",
        }
        second = served.run_cli("serve", config=first.config, env={**first.env, **other_ports})
        assert second.returncode == 1
        [line] = second.stderr.strip().splitlines()
        assert line.startswith("agent-gateway: error: another agent-gateway serve is already running on ")
        assert "PostgreSQL" in line
        # The first one is untouched and still serves.
        assert httpx.get(f"{first.agent_url}/users", timeout=120).status_code == 200


@pytest.mark.parametrize("role", ["bogus", "api,bogus", ","])
def test_an_unknown_role_is_refused_with_one_line(tmp_path: Path, role: str) -> None:
    result = served.run_cli("serve", "--role", role, config=tmp_path / "absent.toml")
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("agent-gateway: error: --role takes all, api, worker, scheduler")


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_api_and_worker_processes_split_the_work(tmp_path: Path, database_url: str) -> None:
    """An ``api`` process records the Message and its Signal; only a ``worker`` process runs it."""
    directory = tmp_path / "deployment"
    env = _deployment(directory, database_url)
    api = served.ServedGateway.spawn_on_free_ports(directory, env, ("--role", "api"))
    worker: subprocess.Popen[bytes] | None = None
    try:
        user = api.cli_json("users", "add")["id"]
        token = api.cli_json("tokens", "issue", user)["token"]
        auth = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(timeout=120) as client:
            sent = await client.post(f"{api.public_url}/messages", json={"text": "anyone there?"}, headers=auth)
            assert sent.status_code == 201
            [signal] = (await client.get(f"{api.agent_url}/signals")).json()["signals"]
            await asyncio.sleep(1.5)  # room for a worker to claim it, if the api process wrongly ran one
            assert (await client.get(f"{api.agent_url}/signals/{signal['id']}")).json()["state"] == "pending"

            # A worker-only process binds no HTTP address (the api process holds both) and runs it.
            log = directory / "worker.log"
            with open(log, "wb") as out:
                worker = subprocess.Popen(
                    [sys.executable, "-m", "agent_gateway", "serve", "--role", "worker"],
                    env=served.cli_env(api.config, {**api.env, **WORKER_OPS_OFF}),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            deadline = time.monotonic() + DEADLINE_S
            state = "pending"
            while state != "done":
                assert time.monotonic() < deadline, log.read_text()
                assert worker.poll() is None, log.read_text()
                state = (await client.get(f"{api.agent_url}/signals/{signal['id']}")).json()["state"]
                await asyncio.sleep(0.1)
            answer = (await client.get(f"{api.public_url}/messages", params={"after": "1"}, headers=auth)).json()
        assert [m["text"] for m in answer["messages"]] == ["echo: anyone there?"]
        assert "serving no HTTP (roles: worker)" in log.read_text()
    finally:
        worker_status = served.stop_process(worker) if worker is not None else 0
        assert api.stop() == 0
    assert worker_status == 0
