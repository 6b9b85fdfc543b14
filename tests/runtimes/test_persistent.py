"""The persistent runtime with a real long-lived agent program speaking the JSON-lines protocol."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent_gateway.runtimes.persistent import PersistentRuntime
from agent_gateway.runtimes.runtime import RunFailed
from agent_gateway.store.queries.runs import Run

from tests.signals.conftest import until

# Each test runs agent programs: a processes test (scripts/test --fast leaves it out).
pytestmark = pytest.mark.processes

URL = "http://127.0.0.1:9999"
AGENT = Path(__file__).resolve().parents[1] / "persistent_agent.py"


def a_run(prompt: str, run_id: str = "r-1") -> Run:
    return Run(run_id, "s-1", "user_1", prompt, "running", None, "2026-01-01T00:00:00.000Z", None)


class Agent:
    """The test agent's argv and what it recorded."""

    def __init__(self, directory: Path) -> None:
        # tmp_path/agent-files: the folder a confined program may write (the settings fixture's runtime.sandbox_rw).
        (directory / "agent-files").mkdir(exist_ok=True)
        self.record = directory / "agent-files" / "record.jsonl"

    def argv(self, *args: str) -> tuple[str, ...]:
        return (sys.executable, str(AGENT), str(self.record), *args)

    def calls(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def pids(self) -> list[int]:
        """The pids of the programs that recorded each Run, as this host sees them."""
        return [self.pid(index) for index in range(len(self.calls()))]

    def pid(self, index: int) -> int:
        """The pid of the program that recorded Run ``index``, as this host sees it."""
        call = self.calls()[index]
        return self.host_pid(call["pid"], call["pidns"])

    def child(self) -> int:
        """The pid of the child the program started (``spawn``), as this host sees it."""
        child = json.loads(self.record.with_name(self.record.name + ".child").read_text())
        return self.host_pid(child["pid"], child["pidns"])

    @staticmethod
    def host_pid(pid: int, namespace: str) -> int:
        """``pid``, a number of the PID namespace ``namespace``, as this host sees it.

        A confined program knows only the pids of its own PID namespace, which this host
        maps (``NSpid`` in /proc/PID/status) only while the process lives. Its number
        taken for a host pid would name another process here (2 is the kernel's
        kthreadd, which never exits: a wait for it to be gone lasts the whole deadline),
        so a process no longer there is an error at once.
        """
        if namespace == os.readlink("/proc/self/ns/pid"):
            return pid
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(entry / "ns" / "pid") != namespace:
                    continue
                status = (entry / "status").read_text()
            except OSError:
                continue
            nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
            if int(nspid[-1]) == pid:
                return int(entry.name)
        raise AssertionError(f"no process here has the pid {pid} of {namespace}: it has exited")


@pytest.fixture
def agent(tmp_path: Path) -> Agent:
    return Agent(tmp_path)


@pytest.fixture
async def runtimes() -> AsyncIterator[list[PersistentRuntime]]:
    """Runtimes a test makes; each is closed (its program stopped) at the end."""
    made: list[PersistentRuntime] = []
    yield made
    for runtime in made:
        await runtime.close()


@pytest.fixture
def make(runtimes: list[PersistentRuntime]):  # type: ignore[no-untyped-def]
    def make(argv: tuple[str, ...], workdir: Path | None = None) -> PersistentRuntime:
        runtime = PersistentRuntime(argv, agent_server_url=URL, workdir=workdir)
        runtimes.append(runtime)
        return runtime

    return make


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def gone(pid: int) -> None:
    await until(lambda: not alive(pid))


async def test_one_program_answers_every_run_with_the_run_env_and_workdir(
    agent: Agent, make: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_GATEWAY_DATABASE_URL", "postgresql://secret@db/x")
    workdir = tmp_path / "workspace" / "nested"
    runtime = make(agent.argv(), workdir)
    await runtime.run(a_run("ok ü\nline 2", "r-1"))
    await runtime.run(Run("r-2", "s-2", None, "ok", "running", None, None, None))
    first, second = agent.calls()
    assert first["run"] == {"id": "r-1", "signalId": "s-1", "session": "user_1", "prompt": "ok ü\nline 2"}
    assert second["run"] == {"id": "r-2", "signalId": "s-2", "session": None, "prompt": "ok"}
    assert first["pid"] == second["pid"]  # started once
    assert first["cwd"] == str(workdir)
    assert first["env"] == {"AGENT_SERVER_URL": URL}  # none of the gateway's AGENT_GATEWAY_* settings


async def test_start_runs_the_program_before_the_first_run(agent: Agent, make: Any, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    runtime = make(("/bin/sh", "-c", f"echo $$ > {pid_file}; exec {sys.executable} {AGENT} {agent.record}"))
    await runtime.start()
    await until(lambda: pid_file.exists() and pid_file.read_text().strip())
    await runtime.run(a_run("ok"))
    assert agent.pids() == [int(pid_file.read_text())]


async def test_a_failed_answer_fails_the_run_with_its_error_and_keeps_the_program(agent: Agent, make: Any) -> None:
    runtime = make(agent.argv())
    with pytest.raises(RunFailed) as failed:
        await runtime.run(a_run("fail", "r-1"))
    assert failed.value.message == "no luck\nsecond line"
    await runtime.run(a_run("ok", "r-2"))
    first, second = agent.pids()
    assert first == second


@pytest.mark.parametrize(
    ("prompt", "error"),
    [
        ("garbage", "the agent program broke the protocol: a line that is not JSON (20 bytes)"),
        ("wrong-id", "the agent program broke the protocol: an answer for another Run than r-1 (41 bytes)"),
    ],
)
async def test_a_protocol_error_fails_the_run_and_the_next_run_gets_a_fresh_program(
    agent: Agent, make: Any, prompt: str, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = make(agent.argv())
    with caplog.at_level(logging.INFO, logger="agent_gateway"), pytest.raises(RunFailed) as failed:
        await runtime.run(a_run(prompt, "r-1"))
    assert failed.value.message == error
    [broken] = [r for r in caplog.records if getattr(r, "action", None) == "agent_protocol_error"]
    assert broken.levelno == logging.WARNING
    assert "hello" not in broken.getMessage() and "some-other-run" not in broken.getMessage()  # never the agent's text
    old = agent.pids()[0]
    await gone(old)
    await runtime.run(a_run("ok", "r-2"))
    assert agent.pids()[1] != old


@pytest.mark.parametrize(
    "line",
    [b"[1, 2]\n", b'{"type": "started", "run": "r-1"}\n', b'{"type": "failed", "run": "r-1"}\n', b"\n"],
)
async def test_every_other_line_breaks_the_protocol(make: Any, line: bytes) -> None:
    script = f"import sys; sys.stdin.readline(); sys.stdout.buffer.write({line!r}); sys.stdout.flush(); sys.stdin.read()"
    with pytest.raises(RunFailed) as failed:
        await make((sys.executable, "-c", script)).run(a_run("ok"))
    assert failed.value.message.startswith("the agent program broke the protocol: ")


async def test_a_program_that_exits_mid_run_fails_it_with_status_and_stderr_and_is_started_again(
    agent: Agent, make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    argv = agent.argv()
    runtime = make(argv)
    with caplog.at_level(logging.INFO, logger="agent_gateway"), pytest.raises(RunFailed) as failed:
        await runtime.run(a_run("exit", "r-1"))
    assert failed.value.message == "the agent program exited with status 3; stderr ends with:\ndying mid-Run"
    [record] = [r for r in caplog.records if getattr(r, "action", None) == "run_failed"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == f"Run r-1 failed: the agent program exited with status 3 (program {argv[0]})"
    await runtime.run(a_run("ok", "r-2"))  # not the same Run again: the next one, on a fresh program
    assert [call["run"]["id"] for call in agent.calls()] == ["r-1", "r-2"]
    assert len(set(agent.pids())) == 2


async def test_a_program_that_exits_at_start_fails_the_run_and_restarts_with_backoff(agent: Agent, make: Any) -> None:
    runtime = make(agent.argv("exit-at-start"))
    for run_id in ("r-1", "r-2", "r-3"):
        with pytest.raises(RunFailed) as failed:
            await runtime.run(a_run("ok", run_id))
        assert failed.value.message == (
            "the agent program exited with status 4; stderr ends with:\ncannot start: no model"
        )
    assert runtime._failures == 3  # the next start waits longer


async def test_a_program_that_cannot_be_started_fails_the_run(make: Any, tmp_path: Path) -> None:
    with pytest.raises(RunFailed) as failed:
        await make((str(tmp_path / "missing"),)).run(a_run("ok"))
    assert failed.value.message.startswith("the agent program could not be started: [Errno 2] No such file")


async def test_a_program_silent_for_a_while_then_answering_ends_the_run_done(agent: Agent, make: Any) -> None:
    runtime = make(agent.argv())
    task = asyncio.create_task(runtime.run(a_run("hang")))
    await until(lambda: len(agent.calls()) == 1)
    await asyncio.sleep(0.5)  # no timeout: still waiting
    assert not task.done()
    agent.record.with_name(agent.record.name + ".release").touch()
    await asyncio.wait_for(task, 300)


async def test_a_program_killed_between_runs_is_started_again_for_the_next_run(
    agent: Agent, make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = make(agent.argv())
    await runtime.run(a_run("ok", "r-1"))
    [old] = agent.pids()
    with caplog.at_level(logging.INFO, logger="agent_gateway"):
        os.kill(old, signal.SIGKILL)
        await until(lambda: any(getattr(r, "action", None) == "agent_exited" for r in caplog.records))
    [exited] = [r for r in caplog.records if getattr(r, "action", None) == "agent_exited"]
    assert "killed by signal SIGKILL (9)" in exited.getMessage()
    await runtime.run(a_run("ok", "r-2"))
    assert agent.pids()[1] != old


async def test_close_stops_the_program_and_everything_it_started(agent: Agent, make: Any) -> None:
    runtime = make(agent.argv())
    await runtime.run(a_run("spawn"))
    [pid] = agent.pids()
    child = agent.child()
    await runtime.close()
    await gone(pid)
    await gone(child)


async def test_close_stops_what_the_program_started_that_ignores_sigterm(agent: Agent, make: Any) -> None:
    """The program exits at SIGTERM; what it started and ignores SIGTERM (as a sandbox's init
    does, signalled from outside its PID namespace) is SIGKILLed with the rest of its group."""
    runtime = make(agent.argv())
    await runtime.run(a_run("spawn-stubborn"))
    child = agent.child()
    await runtime.close()
    await gone(child)


async def test_cancelling_a_run_stops_the_program(agent: Agent, make: Any) -> None:
    runtime = make(agent.argv())
    task = asyncio.create_task(runtime.run(a_run("hang")))
    await until(lambda: len(agent.calls()) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await gone(agent.pids()[0])


async def test_kill_sigkills_the_program_and_its_group_at_once_and_the_next_run_starts_another(
    agent: Agent, make: Any
) -> None:
    """Leadership lost: the program and what it started die at once mid-Run, a child that ignores
    SIGTERM included (nothing else signals them here: the Run is not cancelled, the runtime not
    closed), and the next Run gets a fresh program."""
    runtime = make(agent.argv())
    assert runtime.kill() is False  # no program yet
    await runtime.run(a_run("spawn-stubborn"))
    [pid] = agent.pids()
    child = agent.child()
    task = asyncio.create_task(runtime.run(a_run("hang", "r-2")))
    try:
        await until(lambda: len(agent.calls()) == 2)
        assert runtime.kill() is True
        await gone(pid)
        await gone(child)
        # The Signal Worker cancels the Run at once; left alone, it fails saying how the program ended.
        with pytest.raises(RunFailed, match="killed by signal SIGKILL"):
            await task
        assert runtime.kill() is False
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await runtime.run(a_run("ok", "r-3"))
    assert agent.pids()[2] != pid


async def test_a_program_killed_just_before_a_run_does_not_fail_that_run(agent: Agent, make: Any) -> None:
    """Killed, and the next Run handed at once: before asyncio has noticed the exit."""
    runtime = make(agent.argv())
    await runtime.run(a_run("ok", "r-1"))
    [old] = agent.pids()
    os.kill(old, signal.SIGKILL)
    # Wait (blocking the loop, so asyncio cannot notice) until the kernel says it exited.
    while True:
        try:
            if os.waitid(os.P_PID, old, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                break
        except ChildProcessError:  # asyncio's watcher thread (3.11's default) collected it already
            break
        time.sleep(0.001)
    await runtime.run(a_run("ok", "r-2"))
    assert agent.pids()[1] != old


async def test_what_a_program_started_is_stopped_when_it_exits_mid_run(agent: Agent, make: Any) -> None:
    runtime = make(agent.argv())
    await runtime.run(a_run("spawn", "r-1"))
    child = agent.child()
    with pytest.raises(RunFailed):
        await runtime.run(a_run("exit", "r-2"))
    await gone(child)
