"""A confined program that fails, is killed, cannot be started, floods its stderr, hangs or is stopped
behaves exactly as an unconfined one (tests/runtimes): the same Run errors, word for word."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_gateway import config
from agent_gateway.runtimes.command import CommandRuntime
from agent_gateway.runtimes.failure import RunFailed
from agent_gateway.runtimes.persistent import PersistentRuntime
from agent_gateway.sandbox import cgroups, choose
from agent_gateway.sandbox.bubblewrap import Sandbox
from agent_gateway.store.queries.runs import Run

from tests.runtimes.test_persistent import AGENT, Agent
from tests.signals.conftest import AgentProgram, until

URL = "http://127.0.0.1:9999"
# A program that notes SIGTERM in its record folder, so the grace period is seen to reach it.
GRACEFUL = """
import pathlib, signal, sys, time
note = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: (note.write_text("terminated"), sys.exit(0)))
note.with_name("started").write_text("")
while True:
    time.sleep(0.05)
"""


def a_run(run_id: str = "r-1") -> Run:
    return Run(run_id, "s-1", "user_1", "the prompt", "running", None, "2026-01-01T00:00:00.000Z", None)


@pytest.fixture(params=["unconfined", "confined"])
async def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Sandbox | None]:
    if request.param == "unconfined":
        yield None
        return
    request.getfixturevalue("bwrap")
    confinement = confined(tmp_path)
    yield confinement
    await confinement.close()


def confined(tmp_path: Path) -> Sandbox:
    """A sandbox whose program writes its records in ``tmp_path/agent-files``."""
    (tmp_path / "agent-files").mkdir(exist_ok=True)
    settings = config.Settings(
        token_ttl_ms=1, runtime_sandbox="bubblewrap", runtime_workdir=tmp_path / "workspace",
        runtime_sandbox_rw=(tmp_path / "agent-files",),
    )
    confinement = choose.choose(settings, config.Address("127.0.0.1", 9999))
    assert confinement is not None
    return confinement


def runtime(argv: tuple[str, ...], sandbox: Sandbox | None, tmp_path: Path) -> CommandRuntime:
    return CommandRuntime(argv, agent_server_url=URL, workdir=tmp_path / "workspace", sandbox=sandbox)


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("fail", "the agent program exited with status 3; stderr ends with:\nsomething went wrong\nat the end"),
        ("killed", "the agent program was killed by signal SIGKILL (9); stderr was empty"),
    ],
)
async def test_a_failing_or_killed_program_fails_its_run_alike(
    sandbox: Sandbox | None, tmp_path: Path, mode: str, error: str
) -> None:
    agent = AgentProgram(tmp_path)
    with pytest.raises(RunFailed) as failed:
        await runtime(agent.command(mode), sandbox, tmp_path).run(a_run())
    assert failed.value.message == error
    assert len(agent.calls()) == 1


async def test_a_flood_on_stderr_keeps_only_its_tail(sandbox: Sandbox | None, tmp_path: Path) -> None:
    with pytest.raises(RunFailed) as failed:
        await runtime(AgentProgram(tmp_path).command("noisy"), sandbox, tmp_path).run(a_run())
    assert failed.value.message.startswith("the agent program exited with status 4; stderr ends with:\n[...]")
    assert failed.value.message.endswith("line 0999 of noise")


async def test_a_program_that_cannot_be_started_says_why(sandbox: Sandbox | None, tmp_path: Path) -> None:
    script = tmp_path / "agent-files" / "agent.sh"
    script.parent.mkdir(exist_ok=True)
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    for argv, reason in (((str(script),), "[Errno 13] Permission denied"), ((str(tmp_path / "missing"),), "[Errno 2] No such file")):
        with pytest.raises(RunFailed) as failed:
            await runtime(argv, sandbox, tmp_path).run(a_run())
        assert failed.value.message.startswith(f"the agent program could not be started: {reason}")


async def test_a_cgroup_that_cannot_be_joined_fails_the_run_and_never_stops_the_agent_starting_again(
    bwrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "agent-files").mkdir()
    settings = config.Settings(
        token_ttl_ms=1, runtime_sandbox="bubblewrap", runtime_workdir=tmp_path / "workspace",
        runtime_sandbox_rw=(tmp_path / "agent-files",),
    )
    confinement = choose.choose(settings, config.Address("127.0.0.1", 9999))
    assert confinement is not None
    agent = Agent(tmp_path)
    persistent = PersistentRuntime(
        (sys.executable, str(AGENT), str(agent.record)), agent_server_url=URL, workdir=tmp_path / "workspace",
        sandbox=confinement,
    )
    try:
        await confinement.prepare()
        # The agent's cgroup gone from under the gateway: joining it fails in the child, before exec.
        confinement._group = cgroups.Group({"pids": tmp_path / "removed-cgroup"})
        with pytest.raises(RunFailed) as failed:
            await runtime(("/usr/bin/true",), confinement, tmp_path).run(a_run())
        assert failed.value.message == (
            "the agent program could not be started: setting up its process failed "
            "(joining the agent's cgroup, or asking to die with the gateway)"
        )
        await persistent.start()  # what the Signal Worker calls as it starts leading: it must return
        assert "not started ahead of the first Run: the agent program could not be started" in caplog.text
        with pytest.raises(RunFailed):
            await persistent.run(a_run("r-2"))
        confinement._group = None  # a cgroup that can be joined again: the next Run starts the program
        await persistent.run(Run("r-3", "s-3", None, "ok", "running", None, "x", None))
        assert len(agent.calls()) == 1
    finally:
        await persistent.close()


async def test_a_hanging_program_stopped_gets_sigterm_and_its_grace(sandbox: Sandbox | None, tmp_path: Path) -> None:
    folder = tmp_path / "agent-files"
    folder.mkdir(exist_ok=True)
    argv = (sys.executable, "-c", GRACEFUL, str(folder / "note"))
    running = asyncio.create_task(runtime(argv, sandbox, tmp_path).run(a_run()))
    await until(lambda: (folder / "started").exists())
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert (folder / "note").read_text() == "terminated"


async def test_a_persistent_program_killed_mid_run_fails_that_run_and_is_started_again(
    sandbox: Sandbox | None, tmp_path: Path
) -> None:
    agent = Agent(tmp_path)
    persistent = PersistentRuntime(
        (sys.executable, str(AGENT), str(agent.record)), agent_server_url=URL, workdir=tmp_path / "workspace",
        sandbox=sandbox,
    )
    try:
        stuck = asyncio.create_task(persistent.run(Run("r-1", "s-1", None, "hang", "running", None, "x", None)))
        await until(lambda: len(agent.calls()) == 1)
        [pid] = agent.pids()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(RunFailed) as failed:
            await stuck
        assert failed.value.message == "the agent program was killed by signal SIGKILL (9); stderr was empty"
        await persistent.run(Run("r-2", "s-2", None, "ok", "running", None, "x", None))
        assert [call["run"]["id"] for call in agent.calls()] == ["r-1", "r-2"]  # r-2 by a program started again
    finally:
        await persistent.close()


async def test_everything_confined_ends_when_the_gateways_end_of_the_lifeline_closes(
    bwrap: str, tmp_path: Path
) -> None:
    """bubblewrap asks to die with its parent only after it cloned the sandbox's first process, so a gateway
    killed in between leaves bubblewrap's die-with-parent unarmed. The lifeline does not depend on it: its
    write end closes with the gateway process, however it ends (here: ``Sandbox.close``, with bubblewrap and
    the runtime left running), and everything inside ends."""
    confinement = confined(tmp_path)
    agent = Agent(tmp_path)
    persistent = PersistentRuntime(
        (sys.executable, str(AGENT), str(agent.record)), agent_server_url=URL, workdir=tmp_path / "workspace",
        sandbox=confinement,
    )
    try:
        # The warm program stays after its Run, and so does the child it started.
        await persistent.run(Run("r-1", "s-1", None, "spawn", "running", None, "x", None))
        program, child = agent.pid(0), agent.child()
        assert not ended(program) and not ended(child)
        await confinement.close()
        await until(lambda: ended(program) and ended(child))
    finally:
        await persistent.close()
        await confinement.close()


def ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie nobody reaped yet has ended too)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")
