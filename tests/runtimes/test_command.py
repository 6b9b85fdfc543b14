"""The command runtime with real subprocesses (no database involved)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import stat
import sys
import uuid
from pathlib import Path

import pytest

from agent_gateway.config import Address
from agent_gateway.runtimes import command, runtime
from agent_gateway.runtimes.command import CommandRuntime
from agent_gateway.runtimes.runtime import RunFailed
from agent_gateway.store.queries.runs import Run

from tests.runtimes.test_persistent import alive
from tests.signals.conftest import AgentProgram, until

# Each test runs agent programs: a processes test (scripts/test --fast leaves it out).
pytestmark = pytest.mark.processes

URL = "http://127.0.0.1:9999"


def a_run(prompt: str = "the prompt", session: str | None = "user_1") -> Run:
    return Run("r-1", "s-1", session, prompt, "running", None, "2026-01-01T00:00:00.000Z", None)


async def test_exit_0_is_done_and_the_program_gets_prompt_env_and_workdir(
    agent_program: AgentProgram, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_GATEWAY_DATABASE_URL", "postgresql://secret@db/x")
    monkeypatch.setenv("UNRELATED_SETTING", "kept")
    workdir = tmp_path / "workspace" / "nested"
    argv = agent_program.command("ok", "--resume", "{session}", "{run_id}:{signal_id}", "{other}", "{session}{session}")
    await CommandRuntime(argv, agent_server_url=URL, workdir=workdir).run(a_run("Prompt ü\nline 2"))

    [call] = agent_program.calls()
    assert call["argv"] == ["--resume", "user_1", "r-1:s-1", "{other}", "user_1user_1"]
    assert call["stdin"] == "Prompt ü\nline 2"
    assert call["cwd"] == str(workdir)
    assert call["env"] == {
        "AGENT_SERVER_URL": URL,
        "AGENT_GATEWAY_RUN_ID": "r-1",
        "AGENT_GATEWAY_SESSION": "user_1",
        "AGENT_GATEWAY_SIGNAL_ID": "s-1",
    }


async def test_a_placeholder_inside_a_value_is_not_expanded_again(agent_program: AgentProgram) -> None:
    argv = agent_program.command("ok", "{session}")
    await CommandRuntime(argv, agent_server_url=URL).run(a_run(session="{run_id}"))
    assert agent_program.calls()[0]["argv"] == ["{run_id}"]


async def test_a_large_prompt_is_written_whole(agent_program: AgentProgram) -> None:
    prompt = "x" * 1_000_000 + "end"
    await CommandRuntime(agent_program.command("ok"), agent_server_url=URL).run(a_run(prompt))
    assert agent_program.calls()[0]["stdin"] == prompt


async def test_a_program_that_ignores_stdin_is_still_done(tmp_path: Path) -> None:
    argv = (sys.executable, "-c", "pass")
    await CommandRuntime(argv, agent_server_url=URL).run(a_run("y" * 1_000_000))


async def test_a_nonzero_exit_fails_with_the_status_and_the_stderr_tail(agent_program: AgentProgram) -> None:
    with pytest.raises(RunFailed) as failed:
        await CommandRuntime(agent_program.command("fail"), agent_server_url=URL).run(a_run())
    assert failed.value.message == (
        "the agent program exited with status 3; stderr ends with:\nsomething went wrong\nat the end"
    )


async def test_the_stderr_tail_is_bounded(agent_program: AgentProgram) -> None:
    with pytest.raises(RunFailed) as failed:
        await CommandRuntime(agent_program.command("noisy"), agent_server_url=URL).run(a_run())
    message = failed.value.message
    assert message.startswith("the agent program exited with status 4; stderr ends with:\n[...]")
    assert message.endswith("line 0999 of noise")
    assert "line 0000" not in message
    tail = message.split("\n", 1)[1]
    assert command.STDERR_TAIL_BYTES - 30 <= len(tail.encode()) <= command.STDERR_TAIL_BYTES + len("[...]")


async def test_a_program_killed_by_a_signal_says_so(agent_program: AgentProgram) -> None:
    with pytest.raises(RunFailed) as failed:
        await CommandRuntime(agent_program.command("killed"), agent_server_url=URL).run(a_run())
    assert failed.value.message == "the agent program was killed by signal SIGKILL (9); stderr was empty"


async def test_a_failed_run_is_logged_as_a_warning_naming_the_program(
    agent_program: AgentProgram, caplog: pytest.LogCaptureFixture
) -> None:
    argv = agent_program.command("fail")
    with caplog.at_level(logging.INFO, logger="agent_gateway"), pytest.raises(RunFailed):
        await CommandRuntime(argv, agent_server_url=URL).run(a_run())
    [record] = [r for r in caplog.records if r.name == "agent_gateway.runtimes.command"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"Run {record.args[0]} failed: the agent program exited with status 3 (program {argv[0]})"
    )
    assert "something went wrong" not in caplog.text  # the stderr tail stays in the Run


async def test_a_program_that_cannot_be_started_is_logged_with_its_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = str(tmp_path / "missing")
    with caplog.at_level(logging.INFO, logger="agent_gateway"), pytest.raises(RunFailed):
        await CommandRuntime([missing], agent_server_url=URL).run(a_run())
    [record] = [r for r in caplog.records if r.name == "agent_gateway.runtimes.command"]
    assert record.levelno == logging.WARNING
    assert "could not be started: [Errno 2] No such file or directory" in record.getMessage()
    assert record.getMessage().endswith(f"(program {missing})")


async def test_a_program_that_cannot_be_executed_fails_the_run_clearly(tmp_path: Path) -> None:
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)  # not executable
    with pytest.raises(RunFailed) as failed:
        await CommandRuntime([str(script)], agent_server_url=URL).run(a_run())
    assert failed.value.message.startswith("the agent program could not be started: [Errno 13] Permission denied")

    with pytest.raises(RunFailed) as failed:
        await CommandRuntime([str(tmp_path / "missing")], agent_server_url=URL).run(a_run())
    assert failed.value.message.startswith("the agent program could not be started: [Errno 2] No such file")


async def test_a_workspace_that_cannot_be_created_fails_the_run(tmp_path: Path, agent_program: AgentProgram) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RunFailed) as failed:
        await CommandRuntime(agent_program.command("ok"), agent_server_url=URL, workdir=blocker / "ws").run(a_run())
    assert failed.value.message.startswith(f"the Workspace {blocker / 'ws'} could not be created")
    assert agent_program.calls() == []


async def test_cancelling_a_run_stops_the_program(agent_program: AgentProgram, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    # A shell whose child sleeps: stopping must reach the whole process group.
    argv = ("/bin/sh", "-c", f'sleep 600 & echo $! > {pid_file}; wait')
    task = asyncio.create_task(CommandRuntime(argv, agent_server_url=URL).run(a_run()))
    for _ in range(3000):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the program never started")
    child = int(pid_file.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(500):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the agent program's child survived")


async def test_kill_sigkills_the_program_and_its_group_at_once_and_fails_its_run(tmp_path: Path) -> None:
    """Leadership lost: the program of the Run in progress and its child die at once, though both
    ignore SIGTERM (a trap the child inherits); nothing else signals them here."""
    pid_file = tmp_path / "pid"
    argv = ("/bin/sh", "-c", f'trap "" TERM; sleep 600 & echo $! > {pid_file}; wait')
    runtime = CommandRuntime(argv, agent_server_url=URL)
    assert runtime.kill() is False  # no Run in progress
    task = asyncio.create_task(runtime.run(a_run()))
    try:
        await until(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
        child = int(pid_file.read_text())
        # The program may write its pid before the runtime has it back from starting it: kill() is
        # True once it has.
        await until(runtime.kill)
        with pytest.raises(RunFailed, match="killed by signal SIGKILL"):
            await task
        await until(lambda: not alive(child))
        assert runtime.kill() is False
    finally:
        task.cancel()  # a failed check leaves no program behind
        await asyncio.gather(task, return_exceptions=True)


async def test_cancelling_a_run_while_the_program_starts_stops_it_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel that lands before the program is fully started still stops its whole group.

    Whether the shell got as far as starting its child before it was stopped is up
    to the scheduler, so the check is that no process of the program's is left:
    all of them carry a marker in their environment.
    """
    marker = f"AGW_TEST_MARK={uuid.uuid4()}"
    monkeypatch.setenv(*marker.split("=", 1))
    argv = ("/bin/sh", "-c", "sleep 600 & wait")
    task = asyncio.create_task(CommandRuntime(argv, agent_server_url=URL).run(a_run()))
    await asyncio.sleep(0)  # inside create_subprocess_exec, before the process is handed back
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 300)
    for _ in range(500):
        if not _processes_with(marker):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"processes of the program's are still running: {_processes_with(marker)}")


async def test_a_program_cancelled_while_it_starts_is_sigkilled_with_no_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """It has been given nothing to finish, and a runtime's kill() (leadership lost) cannot reach it
    yet: SIGKILL at once. The program ignores SIGTERM from its first instruction (the disposition
    this process passes on, restored after) and the grace period is an hour: SIGTERM first would
    leave the cancelled task waiting that hour."""
    monkeypatch.setattr(command.processes, "TERMINATE_GRACE_S", 3600.0)
    marker = f"AGW_TEST_MARK={uuid.uuid4()}"
    monkeypatch.setenv(*marker.split("=", 1))
    argv = ("/bin/sh", "-c", "sleep 600 & wait")
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # until the program has been started
    try:
        task = asyncio.create_task(CommandRuntime(argv, agent_server_url=URL).run(a_run()))
        await asyncio.sleep(0)  # inside spawn, before the process is handed back
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 300)
    finally:
        signal.signal(signal.SIGTERM, previous)
    await until(lambda: not _processes_with(marker))


def _processes_with(environment_entry: str) -> list[int]:
    """The live processes (other than this one) whose environment holds ``environment_entry``."""
    found = []
    wanted = environment_entry.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environment = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or a kernel thread
            continue
        if wanted in environment.split(b"\0"):
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize(
    ("address", "url"),
    [
        (Address("127.0.0.1", 8701), "http://127.0.0.1:8701"),
        (Address("0.0.0.0", 8701), "http://127.0.0.1:8701"),
        (Address("::", 8701), "http://[::1]:8701"),
        (Address("::1", 8701), "http://[::1]:8701"),
        (Address("agent.internal", 80), "http://agent.internal:80"),
    ],
)
def test_the_agent_server_url_an_agent_reaches(address: Address, url: str) -> None:
    assert runtime.agent_server_url(address) == url


async def test_without_a_command_every_run_fails_saying_so() -> None:
    with pytest.raises(RunFailed) as failed:
        await runtime.NoRuntime().run(a_run())
    assert failed.value.message == "no agent program is configured (set [runtime] command in gateway.toml)"


async def test_a_program_that_leaves_at_once_is_done() -> None:
    # On uvloop a write to the pipe of a program that has gone raises RuntimeError, and
    # `true` exits before its Prompt is written about half the time.
    true = shutil.which("true")
    assert true is not None
    for _ in range(40):
        await CommandRuntime((true,), agent_server_url=URL).run(a_run("y" * 100_000))


async def test_feeding_a_program_that_has_gone_is_not_an_error() -> None:
    process = await asyncio.create_subprocess_exec("true", stdin=asyncio.subprocess.PIPE)
    await process.wait()
    assert process.stdin is not None
    while not process.stdin.is_closing():
        await asyncio.sleep(0.01)  # the loop notices the closed pipe
    await command._feed(process.stdin, b"the prompt")
