"""What a failed Run puts in the operator's log: never the agent's own text, which may quote a User's
Message (docs/operate/security.md). A protocol error names the problem and the line's length; a
``failed`` answer is logged by its length, its error kept in the Run; and a confined program that
writes the sandbox's "could not be started" words on stderr and exits 127 is a program that exited
127: only the exec-error pipe, which the agent program never holds, says a program could not start."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_gateway.runtimes.command import CommandRuntime
from agent_gateway.runtimes.persistent import PersistentRuntime
from agent_gateway.runtimes.runtime import RunFailed
from agent_gateway.sandbox import inside
from agent_gateway.sandbox.bubblewrap import Sandbox
from tests.runtimes.test_persistent import a_run
from tests.sandbox.conftest import bwrap
from tests.sandbox.test_faults import confined

__all__ = ["bwrap"]

pytestmark = pytest.mark.processes

URL = "http://127.0.0.1:9999"
# A User's words, as an agent might quote them.
SECRET = "my bank PIN is 4321"
# Reads the Run, writes LINE on stdout, then waits for the next Run.
ANSWERING = (
    "import sys; sys.stdin.readline(); sys.stdout.write(sys.argv[1] + '\\n'); sys.stdout.flush(); sys.stdin.read()"
)
FORGED = f"echo '{inside.START_FAILED_PREFIX}{SECRET}' >&2; exit {inside.START_FAILED_STATUS}"


@pytest.fixture
async def persistent() -> AsyncIterator[list[PersistentRuntime]]:
    made: list[PersistentRuntime] = []
    yield made
    for runtime in made:
        await runtime.close()


def run_failed_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if getattr(r, "action", None) == "run_failed"]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (SECRET * 50, "a line that is not JSON"),
        (json.dumps([SECRET]), "a JSON line that is not an object"),
        (json.dumps({"type": SECRET, "run": "r-1"}), 'an object whose "type" is neither "done" nor "failed"'),
        (json.dumps({"type": "done", "run": SECRET}), "an answer for another Run than r-1"),
        (json.dumps({"type": "failed", "run": "r-1", "error": [SECRET]}), 'a "failed" answer without a string "error"'),
    ],
)
async def test_a_protocol_error_names_the_problem_and_the_length_never_the_line(
    persistent: list[PersistentRuntime], caplog: pytest.LogCaptureFixture, line: str, problem: str
) -> None:
    runtime = PersistentRuntime((sys.executable, "-c", ANSWERING, line), agent_server_url=URL)
    persistent.append(runtime)
    with caplog.at_level(logging.INFO, logger="agent_gateway"), pytest.raises(RunFailed) as failed:
        await runtime.run(a_run("ok"))
    named = f"{problem} ({len(line.encode())} bytes)"
    assert failed.value.message == f"the agent program broke the protocol: {named}"
    assert run_failed_lines(caplog) == [
        f"Run r-1 failed: the agent program broke the protocol: {named} (program {sys.executable})"
    ]
    assert "PIN" not in caplog.text


async def test_a_failed_answer_keeps_its_error_in_the_run_and_the_log_says_only_how_long_it_is(
    persistent: list[PersistentRuntime], caplog: pytest.LogCaptureFixture
) -> None:
    error = f"the User said: {SECRET}\nand more"
    line = json.dumps({"type": "failed", "run": "r-1", "error": error})
    runtime = PersistentRuntime((sys.executable, "-c", ANSWERING, line), agent_server_url=URL)
    persistent.append(runtime)
    with caplog.at_level(logging.INFO, logger="agent_gateway"), pytest.raises(RunFailed) as failed:
        await runtime.run(a_run("ok"))
    assert failed.value.message == error
    assert run_failed_lines(caplog) == [
        f"Run r-1 failed: the agent program answered failed, with an error of {len(error)} characters"
        + f" (program {sys.executable})"
    ]
    assert "PIN" not in caplog.text


@pytest.fixture
async def sandbox(bwrap: str, tmp_path: Path) -> AsyncIterator[Sandbox]:
    confinement = confined(tmp_path)
    yield confinement
    await confinement.close()


async def test_a_confined_program_cannot_forge_a_start_failure(
    sandbox: Sandbox, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = CommandRuntime(
        ("/bin/sh", "-c", FORGED), agent_server_url=URL, workdir=tmp_path / "workspace", sandbox=sandbox
    )
    with caplog.at_level(logging.INFO, logger="agent_gateway"), pytest.raises(RunFailed) as failed:
        await runtime.run(a_run("ok"))
    # The Run keeps what the program wrote, as any program's stderr tail; the log, its exit status only.
    assert failed.value.message == (
        f"the agent program exited with status 127; stderr ends with:\n{inside.START_FAILED_PREFIX}{SECRET}"
    )
    assert run_failed_lines(caplog) == ["Run r-1 failed: the agent program exited with status 127 (program /bin/sh)"]
    assert "PIN" not in caplog.text


async def test_a_confined_persistent_program_cannot_forge_a_start_failure_either(
    sandbox: Sandbox, tmp_path: Path, persistent: list[PersistentRuntime], caplog: pytest.LogCaptureFixture
) -> None:
    forged = f"read line; {FORGED}"
    runtime = PersistentRuntime(
        ("/bin/sh", "-c", forged), agent_server_url=URL, workdir=tmp_path / "workspace", sandbox=sandbox
    )
    persistent.append(runtime)
    with caplog.at_level(logging.INFO, logger="agent_gateway"), pytest.raises(RunFailed) as failed:
        await runtime.run(a_run("ok"))
    assert failed.value.message.startswith("the agent program exited with status 127; stderr ends with:\n")
    assert run_failed_lines(caplog) == ["Run r-1 failed: the agent program exited with status 127 (program /bin/sh)"]
    assert "PIN" not in caplog.text


async def test_a_confined_program_that_cannot_be_executed_still_says_why(
    sandbox: Sandbox, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = str(tmp_path / "missing")
    runtime = CommandRuntime((missing,), agent_server_url=URL, workdir=tmp_path / "workspace", sandbox=sandbox)
    with caplog.at_level(logging.INFO, logger="agent_gateway"), pytest.raises(RunFailed) as failed:
        await runtime.run(a_run("ok"))
    reason = "[Errno 2] No such file or directory"
    assert failed.value.message == f"the agent program could not be started: {reason}"
    assert run_failed_lines(caplog) == [
        f"Run r-1 failed: the agent program could not be started: {reason} (program {missing})"
    ]
