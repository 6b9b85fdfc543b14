"""The command runtime: one agent program subprocess per Run (``runtime.mode = "per-run"``).

The program is started from an argv list (no shell) in which ``{session}``,
``{run_id}`` and ``{signal_id}`` are replaced per Run, so an off-the-shelf agent
CLI can resume its Session directly. It reads the Prompt on stdin and gets
``AGENT_SERVER_URL``, ``AGENT_GATEWAY_RUN_ID``, ``AGENT_GATEWAY_SESSION`` and
``AGENT_GATEWAY_SIGNAL_ID`` in its environment. Exit status 0 is ``done``;
anything else fails the Run with the status and the tail of stderr. Its stdout
is discarded: an agent answers through the Agent server. How the process is
started and stopped is ``process.py``'s, shared with the persistent runtime;
with a ``sandbox`` (``runtime.sandbox``), each Run's program starts confined.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal

from agent_gateway.runtimes import process as processes
from agent_gateway.runtimes.process import STDERR_TAIL_BYTES
from agent_gateway.store.queries.runs import Run

__all__ = ["STDERR_TAIL_BYTES", "CommandRuntime"]

# After the program exits, how long a descendant still holding its stderr open may delay the outcome.
STDERR_DRAIN_S = 1.0
_PLACEHOLDER = re.compile(r"\{(session|run_id|signal_id)\}")

logger = logging.getLogger(__name__)


class CommandRuntime(processes.Program):
    # The program of the Run in progress, for kill().
    _process: asyncio.subprocess.Process | None = None

    def kill(self) -> bool:
        """SIGKILL the program of the Run in progress and its group at once (leadership lost: no grace
        period, since a new leader may start its own soon); True if there was one. The Run's
        cancellation, which follows, then finds it gone."""
        if self._process is None:
            return False
        processes.signal_group(self._process, signal.SIGKILL)
        return True

    async def close(self) -> None:
        """Stop the sandbox's ends (the Signal Worker calls this when it stops leading)."""
        if self.sandbox is not None:
            await self.sandbox.close()

    def command(self, run: Run) -> list[str]:
        """The argv of ``run``: placeholders replaced in one pass, so a value is never expanded again."""
        values = {"session": run.session or "", "run_id": run.id, "signal_id": run.signal_id}
        return [_PLACEHOLDER.sub(lambda match: values[match[1]], arg) for arg in self.argv]

    def environment(self, run: Run) -> dict[str, str]:
        return processes.environment(
            self.agent_server_url,
            {
                "AGENT_GATEWAY_RUN_ID": run.id,
                "AGENT_GATEWAY_SESSION": run.session or "",
                "AGENT_GATEWAY_SIGNAL_ID": run.signal_id,
            },
        )

    async def run(self, run: Run) -> None:
        """Run the agent program for ``run``; raise :class:`RunFailed` unless it exits 0."""
        with processes.failures_logged(run.id, self.argv[0], logger):
            await self._run(run)

    async def _run(self, run: Run) -> None:
        processes.make_workdir(self.workdir)
        process, exec_error = await processes.spawn(
            self.command(run), env=self.environment(run), workdir=self.workdir, stdout=asyncio.subprocess.DEVNULL,
            sandbox=self.sandbox,
        )
        self._process = process
        try:
            await self._wait(process, exec_error, run)
        finally:
            self._process = None
            exec_error.close()

    async def _wait(self, process: asyncio.subprocess.Process, exec_error: processes.ExecError, run: Run) -> None:
        assert process.stdin is not None and process.stderr is not None
        feeding = asyncio.create_task(_feed(process.stdin, run.prompt.encode()))
        tail = processes.Tail()
        reading = asyncio.create_task(tail.read(process.stderr))
        try:
            status = await process.wait()
            await feeding
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STDERR_DRAIN_S):
                    await asyncio.shield(reading)
        except asyncio.CancelledError:
            await asyncio.shield(processes.terminate(process))
            raise
        finally:
            for task in (feeding, reading):
                task.cancel()
        if status != 0:
            raise processes.exit_failure(status, tail, confined=self.sandbox is not None, exec_error=exec_error.text())


async def _feed(stdin: asyncio.StreamWriter, prompt: bytes) -> None:
    """Write the Prompt and close stdin; a program that does not read it is not an error."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if stdin.is_closing():  # the program has gone; uvloop (serve's loop) raises RuntimeError on a write
            return
        stdin.write(prompt)
        await stdin.drain()
        stdin.close()
        await stdin.wait_closed()
