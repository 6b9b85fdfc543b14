"""``agent-gateway doctor``: the signing key, the database, the addresses and confinement, checked
without serving; exit status 0 or 1 (both backends, and with bwrap hidden from PATH)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agent_gateway import deployment
from agent_gateway.store import migrate
from tests.sandbox.conftest import bwrap  # noqa: F401 (the fixture: a bwrap that confines here)
from tests.served import free_port, run_cli

pytestmark = pytest.mark.processes

# PATH without bwrap (the command and its agent are named by absolute path).
NO_BWRAP = {"PATH": "/nonexistent"}
OTHER_AGENT = {"AGENT_GATEWAY_RUNTIME_COMMAND": json.dumps([sys.executable, "-c", "pass"])}


def doctor(directory: Path, database_url: str, **env: str) -> subprocess.CompletedProcess[str]:
    if not (directory / "gateway.toml").exists():
        deployment.write(directory)  # what init writes: the echo demo, a fresh key
    variables = {
        "AGENT_GATEWAY_DATABASE_URL": database_url,
        "AGENT_GATEWAY_PUBLIC_LISTEN": f"127.0.0.1:{free_port()}",
        "AGENT_GATEWAY_AGENT_LISTEN": f"127.0.0.1:{free_port()}",
        **env,
    }
    return run_cli("doctor", config=directory / "gateway.toml", env=variables)


def lines(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """Each check's line, by the check's name."""
    found = {}
    for line in result.stdout.splitlines():
        status, rest = line.split(None, 1)
        check, detail = rest.split(": ", 1)
        found[check.split(" ")[0]] = f"{status} {detail}"
    return found


def test_a_deployment_serve_can_start_is_all_ok(bwrap: str, database_url: str, tmp_path: Path) -> None:
    result = doctor(tmp_path / "d", database_url)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    found = lines(result)
    assert list(found) == ["signing", "database", "public.listen", "agent.listen", "ops.listen", "confinement", "instructions"]
    assert all(line.startswith("ok ") for line in found.values())
    assert found["signing"].startswith(f"ok {tmp_path / 'd' / 'signing-key.pem'}: ") and found["signing"].endswith(", EdDSA")
    assert found["database"] == f"ok reachable, schema at revision {migrate.HEAD} (current)"
    assert found["confinement"] == f"ok confined by bubblewrap ({bwrap})"


def test_without_bwrap_the_echo_demo_passes_with_its_warning(database_url: str, tmp_path: Path) -> None:
    result = doctor(tmp_path / "d", database_url, **NO_BWRAP)
    assert result.returncode == 0, result.stderr
    assert lines(result)["confinement"] == (
        "ok the echo demo would run UNCONFINED: bwrap was not found on PATH; install bubblewrap "
        '(Debian/Ubuntu: apt-get install bubblewrap), or set runtime.sandbox = "none"'
    )


def test_without_bwrap_any_other_agent_fails_with_the_two_ways_on(database_url: str, tmp_path: Path) -> None:
    result = doctor(tmp_path / "d", database_url, **NO_BWRAP, **OTHER_AGENT)
    assert result.returncode == 1
    assert lines(result)["confinement"] == (
        'FAIL runtime.sandbox = "auto": the agent program cannot be confined (bwrap was not found on PATH), and only '
        "the bundled echo demo runs unconfined; install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or set "
        'runtime.sandbox = "none" to run it unconfined on purpose'
    )
    assert result.stderr == (
        "agent-gateway: error: 1 of 7 checks failed (confinement): serve would not start\n"
    )
    # Unconfined on purpose is a way on.
    on_purpose = doctor(tmp_path / "d", database_url, **NO_BWRAP, **OTHER_AGENT, AGENT_GATEWAY_RUNTIME_SANDBOX="none")
    assert on_purpose.returncode == 0
    assert lines(on_purpose)["confinement"] == 'ok unconfined on purpose (runtime.sandbox = "none")'


def test_a_taken_port_fails_naming_the_setting(database_url: str, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = doctor(tmp_path / "d", database_url, **NO_BWRAP, AGENT_GATEWAY_AGENT_LISTEN=f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert lines(result)["agent.listen"] == (
        f"FAIL cannot listen on 127.0.0.1:{port}: Address already in use; "
        "set agent.listen (or AGENT_GATEWAY_AGENT_LISTEN) to a free address"
    )
    assert result.stderr.startswith("agent-gateway: error: 1 of 7 checks failed (agent.listen)")


def test_an_empty_database_is_ok_serve_creates_the_schema(empty_database_url: str, tmp_path: Path) -> None:
    result = doctor(tmp_path / "d", empty_database_url, **NO_BWRAP)
    assert result.returncode == 0, result.stderr
    assert lines(result)["database"].startswith("ok ")
    assert f"revision {migrate.HEAD}" in lines(result)["database"]


def test_an_unreachable_database_and_an_unreadable_key_fail(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    deployment.write(directory)
    (directory / "signing-key.pem").unlink()
    result = doctor(directory, f"postgresql://postgres@127.0.0.1:{free_port()}/test", **NO_BWRAP)
    assert result.returncode == 1
    found = lines(result)
    assert found["signing"].startswith("FAIL ") and "signing-key.pem" in found["signing"]
    assert found["database"].startswith("FAIL ")
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("agent-gateway: error: 2 of 7 checks failed (signing key, database ")


def test_a_bad_setting_is_one_line(tmp_path: Path) -> None:
    result = doctor(tmp_path / "d", "mysql://nowhere/db")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("agent-gateway: error: database.url") and result.stderr.count("\n") == 1


def test_a_file_of_runtime_command_linked_in_the_workspace_fails_as_serve_would(database_url: str, tmp_path: Path) -> None:
    """The agent's own ``ln -sf ../signing-key.pem instructions.md``: what serve refuses before it
    migrates, doctor reports, naming the file and never showing what the link points at."""
    directory = tmp_path / "d"
    deployment.write(directory)
    workspace = directory / "workspace"
    workspace.mkdir(exist_ok=True)
    (workspace / "instructions.md").symlink_to("../signing-key.pem")
    command = [sys.executable, "-m", "agent_gateway.agent.llm", "--model", "openai:gpt-4o", "--instructions", "instructions.md"]
    env = {"AGENT_GATEWAY_RUNTIME_COMMAND": json.dumps(command), "AGENT_GATEWAY_RUNTIME_WORKDIR": str(workspace)}
    result = doctor(directory, database_url, AGENT_GATEWAY_RUNTIME_SANDBOX="none", **env)
    assert result.returncode == 1
    found = lines(result)
    assert found["instructions"].startswith(f"FAIL runtime.command's file {workspace / 'instructions.md'} is a symbolic link")
    assert "checks failed (instructions)" in result.stderr
    key = (directory / "signing-key.pem").read_text().splitlines()[1]
    assert key not in result.stdout + result.stderr
