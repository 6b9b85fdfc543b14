"""What both runtimes do to an agent program's process, whichever way it is fed.

The program runs in its own process group (stopping it reaches whatever it
started), in the Workspace when one is set, with ``AGENT_SERVER_URL`` and
without the gateway's own ``AGENT_GATEWAY_*`` settings (database URL and the
like). It is SIGKILLed when the gateway process dies, however it dies, since a
standby then takes the Signal Worker over and starts the next Run at once.
Stopping it is SIGTERM to its group, then SIGKILL after a grace period. Its
stderr is kept as a bounded tail for a failed Run's ``error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from agent_gateway.runtimes.failure import RunFailed
from agent_gateway.sandbox import inside
from agent_gateway.sandbox.bubblewrap import Sandbox

STDERR_TAIL_BYTES = 4096
# On shutdown: SIGTERM to the program's process group, then SIGKILL after this long.
TERMINATE_GRACE_S = 5.0
_ENV_PREFIX = "AGENT_GATEWAY_"
BWRAP_SIGNALLED = 128
MAX_SIGNAL = 64
PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None)


class Program:
    """The agent program a runtime runs: its argv, the Agent server's URL it is given, its
    Workspace (``workdir``) and its confinement (``sandbox``; None runs it unconfined)."""

    def __init__(
        self, argv: Sequence[str], *, agent_server_url: str, workdir: Path | None = None, sandbox: Sandbox | None = None
    ) -> None:
        self.argv = tuple(argv)
        self.agent_server_url = agent_server_url
        self.workdir = workdir
        self.sandbox = sandbox


def environment(agent_server_url: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The gateway's environment minus its own settings, plus ``AGENT_SERVER_URL`` and ``extra``."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(_ENV_PREFIX)}
    env["AGENT_SERVER_URL"] = agent_server_url
    env.update(extra or {})
    return env


def make_workdir(workdir: Path | None) -> None:
    """Create the Workspace when missing; a failure fails the Run."""
    if workdir is None:
        return
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunFailed(f"the Workspace {workdir} could not be created: {exc}") from None


async def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    workdir: Path | None,
    stdout: int,
    limit: int = 2**16,
    sandbox: Sandbox | None = None,
) -> asyncio.subprocess.Process:
    """Start the program with piped stdin and stderr, confined by ``sandbox`` when one is given;
    a program that cannot start fails the Run.

    Cancelled while the program is starting, it lets the program start and then
    stops its whole group: asyncio alone would kill only its first process and
    then wait for every pipe its children hold.
    """
    cwd: Path | None = workdir
    if sandbox is not None:
        try:
            await sandbox.prepare()
        except OSError as exc:
            raise RunFailed(f"the sandbox could not be prepared: {exc}") from None
        env = sandbox.environment(env, workdir)
        argv = sandbox.wrap(argv, env, workdir)
        cwd = None  # bubblewrap's --chdir sets it inside
    spawning = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=stdout,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=dict(env),
            # Its own process group: the gateway decides when the agent stops,
            # and stopping it reaches whatever it started.
            start_new_session=True,
            preexec_fn=_die_with(os.getpid(), sandbox),
            pass_fds=sandbox.inherited() if sandbox is not None else (),
            limit=limit,
        )
    )
    try:
        return await asyncio.shield(spawning)
    except (OSError, ValueError) as exc:
        raise RunFailed(f"the agent program could not be started: {exc}") from None
    except subprocess.SubprocessError:  # _die_with failed in the child, before exec
        raise RunFailed(
            "the agent program could not be started: setting up its process failed "
            "(joining the agent's cgroup, or asking to die with the gateway)"
        ) from None
    except asyncio.CancelledError:
        with contextlib.suppress(OSError, ValueError):
            await asyncio.shield(terminate(await spawning))
        raise


class Tail:
    """The last ``size`` bytes of a stream."""

    def __init__(self, size: int = STDERR_TAIL_BYTES) -> None:
        self.size = size
        self.data = bytearray()
        self.truncated = False

    async def read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self.data += chunk
            if len(self.data) > self.size:
                del self.data[: len(self.data) - self.size]
                self.truncated = True

    def clear(self) -> None:
        self.data.clear()
        self.truncated = False

    def text(self) -> str:
        text = bytes(self.data).decode("utf-8", errors="replace").strip()
        return f"[...]{text}" if self.truncated and text else text


def exit_failure(status: int, stderr: Tail, *, confined: bool = False) -> RunFailed:
    """The failure of a Run whose program ended with ``status``: the reason and the stderr tail.

    bubblewrap reports a program killed by signal N as its own exit status 128 + N,
    and ``inside.py`` a program it could not exec as status 127 and one line.
    """
    if confined and status == inside.START_FAILED_STATUS and stderr.text().startswith(inside.START_FAILED_PREFIX):
        return RunFailed("the agent program could not be started: " + stderr.text().removeprefix(inside.START_FAILED_PREFIX))
    if confined and BWRAP_SIGNALLED < status <= BWRAP_SIGNALLED + MAX_SIGNAL:
        status = BWRAP_SIGNALLED - status
    if status < 0:
        reason = f"the agent program was killed by signal {_signal_name(-status)}"
    else:
        reason = f"the agent program exited with status {status}"
    return with_stderr(reason, stderr)


def with_stderr(reason: str, stderr: Tail) -> RunFailed:
    text = stderr.text()
    return RunFailed(f"{reason}; stderr ends with:\n{text}" if text else f"{reason}; stderr was empty")


def first_line(failed: RunFailed) -> str:
    """What the operator's log says of a failure: only the first line, since the stderr tail is the agent's own text."""
    return failed.message.split("\n", 1)[0].removesuffix("; stderr ends with:")


@contextlib.contextmanager
def failures_logged(run_id: str, program: str, logger: logging.Logger) -> Iterator[None]:
    """Log a :class:`RunFailed` raised inside at WARNING, naming the program: the operator's first clue."""
    try:
        yield
    except RunFailed as failed:
        logger.warning(
            "Run %s failed: %s (program %s)", run_id, first_line(failed), program, extra={"action": "run_failed"}
        )
        raise


async def terminate(process: asyncio.subprocess.Process) -> None:
    """Stop the program's whole process group: SIGTERM, then SIGKILL after the grace period; and
    SIGKILL to whatever of the group outlives its leader. A sandbox's init (bubblewrap's, the
    first process of its PID namespace) ignores a SIGTERM from outside, and once the leader has
    gone nothing else would stop it: it was seen left running, orphaned, after a test's gateway stopped."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TERMINATE_GRACE_S):
                await process.wait()
            break
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _die_with(gateway_pid: int, sandbox: Sandbox | None):  # type: ignore[no-untyped-def]
    """What the program's process runs before exec: be SIGKILLed when the gateway process dies.

    A gateway killed outright (SIGKILL, the OOM killer) cannot stop its agent,
    which would run on beside the next leader's Runs. Confined, the process is
    bubblewrap's, which enters the sandbox's limits first (``Sandbox.enter``).
    """

    def die_with_gateway() -> None:
        if sandbox is not None:
            sandbox.enter()
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != gateway_pid:  # the gateway died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return die_with_gateway


def _signal_name(signum: int) -> str:
    try:
        return f"{signal.Signals(signum).name} ({signum})"
    except ValueError:
        return str(signum)
