"""The command runtime: one agent program subprocess per Run.

The program is started from an argv list (no shell) in which ``{session}``,
``{run_id}`` and ``{signal_id}`` are replaced per Run, so an off-the-shelf agent
CLI can resume its Session directly. It reads the Prompt on stdin and gets
``AGENT_SERVER_URL``, ``AGENT_GATEWAY_RUN_ID``, ``AGENT_GATEWAY_SESSION`` and
``AGENT_GATEWAY_SIGNAL_ID`` in its environment; the gateway's own
``AGENT_GATEWAY_*`` settings (database URL and the like) are not passed on.
It runs in the Workspace (``[runtime] workdir``) when one is set. Exit status 0
is ``done``; anything else fails the Run with the status and the tail of
stderr. Its stdout is discarded: an agent answers through the Agent server.
It is killed when the gateway process dies, however it dies, since a standby
then takes the Signal Worker over and starts the next Run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import re
import signal
from collections.abc import Sequence
from pathlib import Path

from agent_gateway.runtimes.runtime import RunFailed
from agent_gateway.store.runs import Run

STDERR_TAIL_BYTES = 4096
# After the program exits, how long a descendant still holding its stderr open may delay the outcome.
STDERR_DRAIN_S = 1.0
# On shutdown: SIGTERM to the program's process group, then SIGKILL after this long.
TERMINATE_GRACE_S = 5.0
_PLACEHOLDER = re.compile(r"\{(session|run_id|signal_id)\}")
_ENV_PREFIX = "AGENT_GATEWAY_"
PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None)

logger = logging.getLogger(__name__)


class CommandRuntime:
    def __init__(self, argv: Sequence[str], *, agent_server_url: str, workdir: Path | None = None) -> None:
        self.argv = tuple(argv)
        self.agent_server_url = agent_server_url
        self.workdir = workdir

    def command(self, run: Run) -> list[str]:
        """The argv of ``run``: placeholders replaced in one pass, so a value is never expanded again."""
        values = {"session": run.session or "", "run_id": run.id, "signal_id": run.signal_id}
        return [_PLACEHOLDER.sub(lambda match: values[match[1]], arg) for arg in self.argv]

    def environment(self, run: Run) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items() if not name.startswith(_ENV_PREFIX)}
        env.update(
            AGENT_SERVER_URL=self.agent_server_url,
            AGENT_GATEWAY_RUN_ID=run.id,
            AGENT_GATEWAY_SESSION=run.session or "",
            AGENT_GATEWAY_SIGNAL_ID=run.signal_id,
        )
        return env

    async def run(self, run: Run) -> None:
        """Run the agent program for ``run``; raise :class:`RunFailed` unless it exits 0."""
        try:
            await self._run(run)
        except RunFailed as failed:
            # The operator's first clue: which program, and what happened to it. Only the
            # first line: the stderr tail is the agent's own text and stays in the Run.
            reason = failed.message.split("\n", 1)[0].removesuffix("; stderr ends with:")
            logger.warning(
                "Run %s failed: %s (program %s)", run.id, reason, self.argv[0], extra={"action": "run_failed"}
            )
            raise

    async def _run(self, run: Run) -> None:
        if self.workdir is not None:
            try:
                self.workdir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise RunFailed(f"the Workspace {self.workdir} could not be created: {exc}") from None
        spawning = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *self.command(run),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                cwd=self.workdir,
                env=self.environment(run),
                # Its own process group: the gateway decides when the agent stops,
                # and stopping it reaches whatever it started.
                start_new_session=True,
                preexec_fn=_die_with(os.getpid()),
            )
        )
        try:
            process = await asyncio.shield(spawning)
        except (OSError, ValueError) as exc:
            raise RunFailed(f"the agent program could not be started: {exc}") from None
        except asyncio.CancelledError:
            # Cancelled while the program was starting: asyncio alone would kill only its
            # first process and then wait for every pipe its children hold. Let it start,
            # then stop its whole group.
            with contextlib.suppress(OSError, ValueError):
                await asyncio.shield(_terminate(await spawning))
            raise
        assert process.stdin is not None and process.stderr is not None
        feeding = asyncio.create_task(_feed(process.stdin, run.prompt.encode()))
        tail = _Tail(STDERR_TAIL_BYTES)
        reading = asyncio.create_task(tail.read(process.stderr))
        try:
            status = await process.wait()
            await feeding
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(reading), STDERR_DRAIN_S)
        except asyncio.CancelledError:
            await asyncio.shield(_terminate(process))
            raise
        finally:
            for task in (feeding, reading):
                task.cancel()
        if status == 0:
            return
        if status < 0:
            reason = f"the agent program was killed by signal {_signal_name(-status)}"
        else:
            reason = f"the agent program exited with status {status}"
        stderr = tail.text()
        raise RunFailed(f"{reason}; stderr ends with:\n{stderr}" if stderr else f"{reason}; stderr was empty")


class _Tail:
    """The last ``size`` bytes of a stream."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.data = bytearray()
        self.truncated = False

    async def read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self.data += chunk
            if len(self.data) > self.size:
                del self.data[: len(self.data) - self.size]
                self.truncated = True

    def text(self) -> str:
        text = bytes(self.data).decode("utf-8", errors="replace").strip()
        return f"[...]{text}" if self.truncated and text else text


def _die_with(gateway_pid: int):  # type: ignore[no-untyped-def]
    """What the program's process runs before exec: be SIGKILLed when the gateway process dies.

    A gateway killed outright (SIGKILL, the OOM killer) cannot stop its agent,
    which would run on beside the next leader's Runs.
    """

    def die_with_gateway() -> None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != gateway_pid:  # the gateway died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return die_with_gateway


async def _feed(stdin: asyncio.StreamWriter, prompt: bytes) -> None:
    """Write the Prompt and close stdin; a program that does not read it is not an error."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if stdin.is_closing():  # the program has gone; uvloop (serve's loop) raises RuntimeError on a write
            return
        stdin.write(prompt)
        await stdin.drain()
        stdin.close()
        await stdin.wait_closed()


async def _terminate(process: asyncio.subprocess.Process) -> None:
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(process.wait(), TERMINATE_GRACE_S)
            return


def _signal_name(signum: int) -> str:
    try:
        return f"{signal.Signals(signum).name} ({signum})"
    except ValueError:
        return str(signum)
