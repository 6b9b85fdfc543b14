"""The persistent runtime: one long-lived agent program, handed one Run at a time (``runtime.mode = "persistent"``).

The program is started once (at leadership, or for the first Run) and again,
with backoff, after it exits. The protocol is JSON lines, one object per line:

- gateway → agent, on its stdin: ``{"type": "run", "run": {"id", "signalId", "session", "prompt"}}``;
- agent → gateway, on its stdout: ``{"type": "done", "run": "<id>"}`` or
  ``{"type": "failed", "run": "<id>", "error": "<text>"}``.

Anything else on stdout (a line that is not such an object, another Run's id)
breaks the protocol: the Run fails saying so and the program is stopped, since
what it writes next can no longer be matched to a Run; the next Run starts a
fresh one. The agent's lines may quote a User's Message: the Run's error names
what was wrong with one and its length, never its text, and the log says of a
``failed`` answer only that it came and how long its error is. A program that
dies mid-Run fails that Run with its exit status and the tail of its stderr
(never logged); the Run is never handed out again. Stopping (shutdown,
leadership lost) and cancelling a Run stop the program as the command runtime
does (``process.py``). No timeout is imposed on a Run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import orjson

from agent_gateway.runtimes import process as processes
from agent_gateway.runtimes.failure import RunFailed
from agent_gateway.sandbox.bubblewrap import Sandbox
from agent_gateway.store.queries.runs import Run

# Longest line the agent may answer with; a longer one breaks the protocol.
MAX_LINE_BYTES = 1024 * 1024
# After the program exits, how long a descendant still holding its stderr open may delay the outcome.
STDERR_DRAIN_S = 1.0
# How often a Run in progress checks whether the program has exited.
EXIT_POLL_S = 0.05
# Restarts after a program that ended without answering a Run wait 0.1 s, 0.2 s, ... up to this.
BACKOFF_MAX_S = 10.0
BACKOFF_FIRST_S = 0.1

logger = logging.getLogger(__name__)


class PersistentRuntime(processes.Program):
    def __init__(
        self, argv: Sequence[str], *, agent_server_url: str, workdir: Path | None = None, sandbox: Sandbox | None = None
    ) -> None:
        super().__init__(argv, agent_server_url=agent_server_url, workdir=workdir, sandbox=sandbox)
        self._agent: _Agent | None = None
        self._lock = asyncio.Lock()
        # Programs in a row that ended without answering a Run; sets the backoff before the next start.
        self._failures = 0
        self._last_start = float("-inf")

    async def start(self) -> None:
        """Start the program ahead of the first Run (the Signal Worker calls this when it starts leading)."""
        async with self._lock:
            try:
                await self._started()
            except RunFailed as failed:
                logger.warning(
                    "the agent program was not started ahead of the first Run: %s (program %s)", processes.first_line(failed),
                    self.argv[0], extra={"action": "agent_start_failed"},
                )

    def kill(self) -> bool:
        """SIGKILL the program and its group at once (leadership lost: no grace period, since a new
        leader may start its own soon); True if there was one. The next Run starts it again."""
        agent = self._agent
        if agent is None:
            return False
        agent.stopping = True  # its exit is no news to log
        processes.signal_group(agent.process, signal.SIGKILL)
        return True

    async def close(self) -> None:
        """Stop the program (SIGTERM to its group, then SIGKILL), and the sandbox's ends; the next Run starts it again."""
        agent, self._agent = self._agent, None
        if agent is not None:
            await agent.stop()
        if self.sandbox is not None:
            await self.sandbox.close()

    async def run(self, run: Run) -> None:
        """Hand ``run`` to the program; raise :class:`RunFailed` unless it answers ``done``."""
        with processes.failures_logged(run.id, self.argv[0], logger):
            async with self._lock:
                await self._run(run)

    async def _run(self, run: Run) -> None:
        agent = await self._started()
        try:
            error = await agent.hand(run)
        except _Ended:
            self._agent = None
            self._failures += 0 if agent.answered else 1
            failed = await agent.failure()
            await asyncio.shield(agent.stop())  # whatever it started, still in its group
            raise failed from None
        except _ProtocolBroken as broken:
            logger.warning(
                "the agent program broke the protocol during Run %s (%s); stopping it", run.id, broken.what,
                extra={"action": "agent_protocol_error"},
            )
            self._agent = None
            await asyncio.shield(agent.stop())
            raise RunFailed(f"the agent program broke the protocol: {broken}") from None
        except asyncio.CancelledError:
            # Stopped mid-Run: the program cannot be told to drop the Run, so it stops.
            self._agent = None
            await asyncio.shield(agent.stop())
            raise
        self._failures = 0
        if error is not None:
            # The error stays the Run's (GET /runs/{id}); the log, which promises no Message text, gets its length.
            logged = f"the agent program answered failed, with an error of {len(error)} characters"
            raise RunFailed(error, logged=logged)

    async def _started(self) -> _Agent:
        """The running program, started (after the backoff it has earned) when there is none."""
        agent = self._agent
        if agent is not None and not agent.exited():
            agent.stderr.clear()  # a Run's failure quotes what the program wrote during that Run
            return agent
        self._agent = None
        if agent is not None:  # it exited between Runs: reap it, and stop whatever it left in its group
            self._failures += 0 if agent.answered else 1
            await agent.stop()
        loop = asyncio.get_running_loop()
        if self._failures:
            backoff = min(BACKOFF_FIRST_S * 2 ** (self._failures - 1), BACKOFF_MAX_S)
            await asyncio.sleep(max(0.0, self._last_start + backoff - loop.time()))
        self._last_start = loop.time()
        processes.make_workdir(self.workdir)
        try:
            process, exec_error = await processes.spawn(
                self.argv,
                env=processes.environment(self.agent_server_url),
                workdir=self.workdir,
                stdout=asyncio.subprocess.PIPE,
                limit=MAX_LINE_BYTES,
                sandbox=self.sandbox,
            )
        except RunFailed:
            self._failures += 1
            raise
        self._agent = _Agent(process, exec_error, self.argv[0], confined=self.sandbox is not None)
        logger.info("agent program started (pid %s)", process.pid, extra={"action": "agent_started"})
        return self._agent


class _Ended(Exception):
    """The program's stdout ended: it exited, or is about to."""


class _ProtocolBroken(Exception):
    """The program wrote something the protocol does not allow; ``what`` names it, and the message adds the
    line's length, without quoting it (the agent chose the line, and the Run's error is logged)."""

    def __init__(self, what: str, line: bytes | None = None) -> None:
        length = None if line is None else len(line.removesuffix(b"\n"))
        super().__init__(what if length is None else f"{what} ({length} bytes)")
        self.what = what


class _Agent:
    """One started program: its pipes, its stderr tail, and a watcher that reports an exit between Runs."""

    def __init__(
        self, process: asyncio.subprocess.Process, exec_error: processes.ExecError, program: str, *, confined: bool
    ) -> None:
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        self.process = process
        self.exec_error = exec_error
        self.program = program
        self.confined = confined
        self.stderr = processes.Tail()
        self.answered = False  # whether it has answered any Run
        self.in_run = False
        self.stopping = False
        self._reading = asyncio.create_task(self.stderr.read(process.stderr))
        self._watching = asyncio.create_task(self._watch())

    def exited(self) -> bool:
        """Whether the program has exited, asked of the kernel now.

        asyncio learns of an exit a moment later: a Run handed to a program
        killed just before would fail although no agent ever saw it.
        ``WNOWAIT`` leaves the exit status for asyncio to collect.
        """
        if self.process.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # already collected by asyncio
            return True

    async def hand(self, run: Run) -> str | None:
        """Write the Run, read the answer: None when done, the error when failed."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.in_run = True
        try:
            message = {
                "type": "run",
                "run": {"id": run.id, "signalId": run.signal_id, "session": run.session, "prompt": run.prompt},
            }
            try:
                if self.process.stdin.is_closing():  # uvloop raises RuntimeError on a write to a closed pipe
                    raise _Ended
                self.process.stdin.write(orjson.dumps(message) + b"\n")
                await self.process.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                raise _Ended from None
            line = await self._answer_line()
            if not line.endswith(b"\n"):
                raise _Ended
            error = _answer(line, run.id)
            self.answered = True
            return error
        finally:
            self.in_run = False

    async def _answer_line(self) -> bytes:
        """The next stdout line; empty when the program exits without one.

        The exit, not the end of stdout, is what counts: a process the program
        started may hold its stdout open long after it died, and asyncio's
        ``wait()`` waits for every pipe to close too; so the exit is polled for.
        An answer written before the exit is still read.
        """
        assert self.process.stdout is not None
        reading = asyncio.ensure_future(self.process.stdout.readline())
        try:
            while not reading.done():
                await asyncio.wait({reading}, timeout=EXIT_POLL_S)
                if not reading.done() and self.exited():
                    await asyncio.wait({reading}, timeout=STDERR_DRAIN_S)
                    break
            return reading.result() if reading.done() else b""
        except ValueError:  # longer than the StreamReader's limit
            raise _ProtocolBroken(f"a line longer than {MAX_LINE_BYTES} bytes") from None
        finally:
            reading.cancel()

    async def failure(self) -> RunFailed:
        """Why the program ended mid-Run: its exit status and stderr tail, once it has exited."""
        while self.process.returncode is None:  # set at the exit, before every pipe has closed
            await asyncio.sleep(EXIT_POLL_S)
        status = self.process.returncode
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STDERR_DRAIN_S):
                await asyncio.shield(self._reading)
        self._reading.cancel()
        return processes.exit_failure(status, self.stderr, confined=self.confined, exec_error=self.exec_error.text())

    async def stop(self) -> None:
        self.stopping = True
        try:
            await processes.terminate(self.process)
        finally:
            self._reading.cancel()
            self._watching.cancel()
            self.exec_error.close()

    async def _watch(self) -> None:
        status = await self.process.wait()
        if not self.stopping and not self.in_run:
            logger.warning(
                "the agent program (pid %s) exited between Runs: %s; it starts again for the next Run",
                self.process.pid,
                processes.first_line(processes.exit_failure(
                    status, processes.Tail(), confined=self.confined, exec_error=self.exec_error.text()
                )),
                extra={"action": "agent_exited"},
            )


def _answer(line: bytes, run_id: str) -> str | None:
    """The outcome an answer line gives the Run ``run_id``: None for done, the error for failed."""
    try:
        answer = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise _ProtocolBroken("a line that is not JSON", line) from None
    if not isinstance(answer, dict):
        raise _ProtocolBroken("a JSON line that is not an object", line)
    if answer.get("type") not in ("done", "failed"):
        raise _ProtocolBroken('an object whose "type" is neither "done" nor "failed"', line)
    if answer.get("run") != run_id:
        raise _ProtocolBroken(f"an answer for another Run than {run_id}", line)
    if answer["type"] == "done":
        return None
    error = answer.get("error")
    if not isinstance(error, str):
        raise _ProtocolBroken('a "failed" answer without a string "error"', line)
    return error
