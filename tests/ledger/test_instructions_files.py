"""The files the instructions entry reads from where the agent writes (its Workspace, runtime.sandbox_rw):
never through a symbolic link there, only regular files, the instructions text bounded; anything
else stops the start with one line, and nothing of what a link points at reaches the ledger."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent_gateway import config, deployment
from agent_gateway.ledger import instructions
from agent_gateway.ledger.instructions import InstructionsError
from agent_gateway.signals.handlers import Handlers
from tests import served

FAKE_KEY = "-----BEGIN PRIVATE KEY-----\nthe gateway's own, never published\n-----END PRIVATE KEY-----\n"


def llm_agent(told: str) -> tuple[str, ...]:
    """The reference LLM agent's command, told by the file ``told``."""
    return (sys.executable, "-m", "agent_gateway.agent.llm", "--model", "openai:gpt-4o", "--instructions", told)


def collect(workspace: Path, command: tuple[str, ...], **changes: Any) -> Any:
    settings = config.Settings(token_ttl_ms=1, runtime_command=command, runtime_workdir=workspace, **changes)
    return instructions.collect(settings, Handlers(), object())


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "workspace").mkdir()
    return tmp_path / "workspace"


@pytest.fixture
def key(tmp_path: Path) -> Path:
    """A stand-in for the signing key, beside the Workspace as in `init`'s folder."""
    path = tmp_path / "signing-key.pem"
    path.write_text(FAKE_KEY)
    return path


def refused(workspace: Path, command: tuple[str, ...], **changes: object) -> str:
    with pytest.raises(InstructionsError) as raised:
        collect(workspace, command, **changes)
    message = str(raised.value)
    assert "\n" not in message
    assert "never published" not in message
    return message


def test_a_normal_instructions_file_is_read_and_hashed(workspace: Path) -> None:
    (workspace / "told.md").write_bytes(b"Be kind.\r\nAlways.\n")
    told = collect(workspace, llm_agent("told.md"))
    # As the agent reads it (Path.read_text): universal newlines.
    assert told["agent"]["instructions"] == "Be kind.\nAlways.\n"
    assert told["runtime"]["files"]["told.md"] == hashlib.sha256(b"Be kind.\r\nAlways.\n").hexdigest()
    # An absolute path into the Workspace, and one through ".." that stays a plain folder, read the same.
    (workspace / "notes").mkdir()
    for name in (str(workspace / "told.md"), "notes/../told.md"):
        assert collect(workspace, llm_agent(name))["agent"]["instructions"] == "Be kind.\nAlways.\n"


def test_a_missing_instructions_file_is_none_as_before(workspace: Path) -> None:
    assert collect(workspace, llm_agent("missing.md"))["agent"]["instructions"] is None


def test_a_symlinked_instructions_file_is_refused_and_nothing_of_it_is_read(workspace: Path, key: Path) -> None:
    # What the agent does inside the sandbox: ln -sf ../signing-key.pem instructions.md
    (workspace / "instructions.md").symlink_to("../signing-key.pem")
    message = refused(workspace, llm_agent("instructions.md"))
    assert message.startswith(f"runtime.command's file {workspace / 'instructions.md'} is a symbolic link")
    assert "folder the agent can write" in message
    # Pointing at a file in the Workspace itself changes nothing: no link is followed there.
    (workspace / "real.md").write_text("Be kind.\n")
    (workspace / "also.md").symlink_to("real.md")
    assert "is a symbolic link" in refused(workspace, llm_agent("also.md"))


def test_the_instructions_file_alone_is_refused_with_its_own_name(workspace: Path, key: Path) -> None:
    """The file named by the LLM agent's option, not an argument of the command (the default name)."""
    (workspace / "instructions.md").symlink_to(key)
    command = (sys.executable, "-m", "agent_gateway.agent.llm", "--model", "openai:gpt-4o")
    assert refused(workspace, command).startswith(
        f"the reference LLM agent's --instructions file {workspace / 'instructions.md'} is a symbolic link"
    )


def test_a_symlinked_folder_on_the_way_is_refused(workspace: Path, tmp_path: Path, key: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "told.md").symlink_to(key)  # the operator's own link, outside: followed if reached
    (outside / "plain.md").write_text(FAKE_KEY)
    (workspace / "notes").symlink_to(outside)
    for name in ("notes/told.md", "notes/plain.md"):
        message = refused(workspace, llm_agent(name))
        assert message.startswith(f"runtime.command's file {workspace / name}: {workspace / 'notes'} is a symbolic")


def test_a_program_or_script_symlinked_in_the_workspace_is_refused(workspace: Path, key: Path) -> None:
    (workspace / "agent.py").symlink_to(key)
    message = refused(workspace, (sys.executable, "agent.py"))
    assert message.startswith(f"runtime.command's file {workspace / 'agent.py'} is a symbolic link")
    assert refused(workspace, (sys.executable, str(workspace / "agent.py"))).startswith("runtime.command's file")
    (workspace / "bin").mkdir()
    (workspace / "bin" / "agent").symlink_to(key)
    assert "is a symbolic link" in refused(workspace, ("bin/agent",))


def test_links_outside_the_agents_folders_are_followed(workspace: Path, tmp_path: Path) -> None:
    """The operator's own links (the interpreter of a venv, say) and a Workspace reached through one."""
    (workspace / "told.md").write_text("Be kind.\n")
    alias = tmp_path / "alias"
    alias.symlink_to(workspace)
    told = collect(workspace, llm_agent(str(alias / "told.md")))
    assert told["agent"]["instructions"] == "Be kind.\n"
    interpreter = hashlib.sha256(Path(sys.executable).read_bytes()).hexdigest()
    assert told["runtime"]["files"][sys.executable] == interpreter
    # The Workspace named through the alias is the same folder: a link in it is still refused.
    (workspace / "link.md").symlink_to("told.md")
    assert "is a symbolic link" in refused(alias, llm_agent("link.md"))


def test_a_runtime_sandbox_rw_folder_is_the_agents_too(workspace: Path, tmp_path: Path, key: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "told.md").symlink_to(key)
    message = refused(workspace, llm_agent(str(shared / "told.md")), runtime_sandbox_rw=(shared,))
    assert message.startswith(f"runtime.command's file {shared / 'told.md'} is a symbolic link")


def test_a_fifo_is_refused_without_waiting_for_a_writer(workspace: Path) -> None:
    fifo = workspace / "instructions.md"
    os.mkfifo(fifo)
    done = threading.Event()

    def writer() -> None:
        """Feeds the fake key to any reader: a gateway that opened the FIFO would publish it (not hang)."""
        while not done.is_set():
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                assert exc.errno == errno.ENXIO  # no reader yet
                time.sleep(0.01)
                continue
            try:
                os.write(fd, FAKE_KEY.encode())
            finally:
                os.close(fd)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        message = refused(workspace, llm_agent("instructions.md"))
    finally:
        done.set()
        thread.join()
    assert message == (
        f"runtime.command's file {fifo} is not a regular file, the only kind the gateway reads from the agent's folders"
    )


def test_instructions_larger_than_a_mebibyte_are_refused(workspace: Path) -> None:
    (workspace / "told.md").write_bytes(b"x" * instructions.INSTRUCTIONS_MAX_BYTES)
    told = collect(workspace, llm_agent("told.md"))
    assert len(told["agent"]["instructions"]) == instructions.INSTRUCTIONS_MAX_BYTES
    (workspace / "told.md").write_bytes(b"x" * (instructions.INSTRUCTIONS_MAX_BYTES + 1))
    assert refused(workspace, llm_agent("told.md")) == (
        f"the reference LLM agent's --instructions file {workspace / 'told.md'} is larger than 1 MiB, "
        "which the ledger does not publish"
    )


@pytest.mark.processes
def test_serve_stops_in_one_line_and_publishes_nothing_of_the_key(tmp_path: Path) -> None:
    """The demonstrated attack: from the Workspace, ln -sf ../signing-key.pem instructions.md, then a
    restart (here the first start, which stops before it migrates)."""
    directory = tmp_path / "gw"
    deployment.write(directory)
    workspace = directory / "workspace"
    workspace.mkdir()
    (workspace / "instructions.md").symlink_to("../signing-key.pem")
    key = (directory / "signing-key.pem").read_text()
    env = {
        "AGENT_GATEWAY_RUNTIME_COMMAND": json.dumps(list(llm_agent("instructions.md"))),
        "AGENT_GATEWAY_RUNTIME_WORKDIR": str(workspace),
        "AGENT_GATEWAY_RUNTIME_SANDBOX": "none",  # the refusal is the gateway's own, confined or not
        **{name: f"127.0.0.1:{served.free_port()}" for name in served.LISTENERS},
    }
    result = served.run_cli("serve", config=directory / "gateway.toml", env=env)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        f"agent-gateway: error: runtime.command's file {workspace / 'instructions.md'} is a symbolic link in a folder "
        "the agent can write, which the gateway never follows (the agent could point one at the gateway's key); "
        "put the file itself there"
    )
    body = key.splitlines()[1]
    assert body not in result.stdout + result.stderr
    # Refused with the other settings, before anything was migrated: no ledger, nothing published.
    with sqlite3.connect(directory / "gateway.db") as db:
        assert db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'ledger_entries'").fetchone() == (0,)
