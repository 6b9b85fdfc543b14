"""What both runtimes do to an agent program's process, whichever way it is fed.

The program runs in its own process group (stopping it reaches whatever it
started), in the Workspace when one is set, with ``AGENT_SERVER_URL`` and
without the gateway's own ``AGENT_GATEWAY_*`` settings (database URL and the
like). It is SIGKILLed when the gateway process dies, however it dies, since a
standby then takes the Signal Worker over and starts the next Run at once.
Stopping it is SIGTERM to its group, then SIGKILL after a grace period;
killing it (leadership lost) is SIGKILL to its group at once. Its
stderr is kept as a bounded tail for a failed Run's ``error``, never logged.

A confined program that cannot be exec'ed is told from one that exits 127
with the same words on its stderr by the exec-error pipe (``inside.py``):
only what arrives on it makes a Run's error "could not be started".
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
# The most of the exec-error pipe read (inside.py writes at most EXEC_ERROR_BYTES).
EXEC_ERROR_BYTES = 4096
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


class ExecError:
    """The gateway's end of a confined program's exec-error pipe (``inside.py``): why exec failed, if it did.

    Read once the program has exited, since ``inside.py`` writes before it
    exits; bubblewrap's outermost process holds a write end until then too, so
    the pipe's end says nothing earlier. Unconfined, there is no pipe (exec
    failing is then spawn's own ``OSError``).
    """

    def __init__(self, fd: int | None = None) -> None:
        self._fd = fd
        self._text: str | None = None

    def text(self) -> str | None:
        """What ``inside.py`` wrote, or None: the first call reads it and closes the pipe."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.set_blocking(fd, False)
                data = os.read(fd, EXEC_ERROR_BYTES)
            except OSError:  # BlockingIOError: nothing written
                data = b""
            finally:
                os.close(fd)
            self._text = data.decode("utf-8", errors="replace") or None
        return self._text

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


async def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    workdir: Path | None,
    stdout: int,
    limit: int = 2**16,
    sandbox: Sandbox | None = None,
) -> tuple[asyncio.subprocess.Process, ExecError]:
    """Start the program with piped stdin and stderr, confined by ``sandbox`` when one is given;
    a program that cannot start fails the Run. The caller reads (or closes) the :class:`ExecError`.

    Cancelled while the program is starting, it lets the program start and then
    SIGKILLs its whole group at once (it has been given nothing to finish, and a
    runtime's ``kill()`` cannot reach it yet): asyncio alone would kill only its
    first process and then wait for every pipe its children hold.
    """
    cwd: Path | None = workdir
    passed: tuple[int, ...] = ()
    exec_error = ExecError()
    if sandbox is not None:
        try:
            await sandbox.prepare()
        except OSError as exc:
            raise RunFailed(f"the sandbox could not be prepared: {exc}") from None
        env = sandbox.environment(env, workdir)
        argv = sandbox.wrap(argv, env, workdir)
        cwd = None  # bubblewrap's --chdir sets it inside
        # Not inheritable (PEP 446): only this program's bubblewrap gets the write end, through pass_fds.
        reading, writing = os.pipe()
        exec_error = ExecError(reading)
        env = {**env, inside.EXEC_ERROR_ENV: str(writing)}
        passed = (*sandbox.inherited(), writing)
    try:
        return await _started(argv, env, cwd, stdout, limit, sandbox, passed), exec_error
    except BaseException:
        exec_error.close()
        raise
    finally:
        if passed:
            os.close(passed[-1])


async def _started(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path | None, stdout: int, limit: int, sandbox: Sandbox | None,
    passed: tuple[int, ...],
) -> asyncio.subprocess.Process:
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
            pass_fds=passed,
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
            await asyncio.shield(terminate(await spawning, grace=False))
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


def exit_failure(status: int, stderr: Tail, *, confined: bool = False, exec_error: str | None = None) -> RunFailed:
    """The failure of a Run whose program ended with ``status``: the reason and the stderr tail.

    bubblewrap reports a program killed by signal N as its own exit status 128 + N,
    and ``inside.py`` a program it could not exec on the exec-error pipe (``exec_error``);
    a status 127 without it is the program's own, whatever its stderr says.
    """
    if exec_error is not None:
        return RunFailed(f"the agent program could not be started: {exec_error}")
    if confined and BWRAP_SIGNALLED < status <= BWRAP_SIGNALLED + MAX_SIGNAL:
        status = BWRAP_SIGNALLED - status
    if status < 0:
        reason = f"the agent program was killed by signal {_signal_name(-status)}"
    else:
        reason = f"the agent program exited with status {status}"
    return with_stderr(reason, stderr)


def with_stderr(reason: str, stderr: Tail) -> RunFailed:
    """``reason`` and the stderr tail, for the Run's error; the log gets ``reason`` alone (the tail is the agent's)."""
    text = stderr.text()
    return RunFailed(f"{reason}; stderr ends with:\n{text}" if text else f"{reason}; stderr was empty", logged=reason)


def first_line(failed: RunFailed) -> str:
    """What the operator's log says of a failure (``RunFailed.logged``): never the agent's own text."""
    return failed.logged


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


async def terminate(process: asyncio.subprocess.Process, *, grace: bool = True) -> None:
    """Stop the program's whole process group: SIGTERM, then SIGKILL after the grace period (at once
    without ``grace``); and SIGKILL to whatever of the group outlives its leader. A sandbox's init
    (bubblewrap's, the first process of its PID namespace) ignores a SIGTERM from outside, and once the
    leader has gone nothing else would stop it: it was seen left running, orphaned, after a test's gateway stopped."""
    for signum in (signal.SIGTERM, signal.SIGKILL) if grace else (signal.SIGKILL,):
        signal_group(process, signum)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TERMINATE_GRACE_S):
                await process.wait()
            break
    signal_group(process, signal.SIGKILL)


def signal_group(process: asyncio.subprocess.Process, signum: int) -> None:
    """Send ``signum`` to the program's whole process group (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


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
