"""The protocol the Signal Worker hands each Run to.

``await runtime.run(run)`` executes one Run (its ``prompt``, ``session``,
``id`` and ``signal_id``): returning means the Run is ``done``; raising
:class:`RunFailed` means ``failed`` with that message; any other exception
fails the Run too, with the exception named. No timeout is imposed. When the
gateway stops during a Run, the call is cancelled and must stop its work.

A runtime may also have ``async start()``, which the Signal Worker awaits when
it starts leading (to warm a long-lived agent up), and ``async close()``, which
it awaits when it stops leading or the gateway stops (to stop that agent), and
``kill()`` (synchronous, True if a program was running), which the Signal
Worker calls the moment this process finds its leadership lost, before the Run
is cancelled: it SIGKILLs the agent program at once, since a graceful stop
could outlast the new leader's wait and two agents would then work at once.
"""

from __future__ import annotations

from typing import Protocol

from agent_gateway.config import Address, Settings
from agent_gateway.runtimes.command import CommandRuntime
from agent_gateway.runtimes.failure import RunFailed
from agent_gateway.runtimes.persistent import PersistentRuntime
from agent_gateway.sandbox import choose
from agent_gateway.store.queries.runs import Run

__all__ = ["NoRuntime", "RunFailed", "Runtime", "agent_server_url", "from_settings"]


class Runtime(Protocol):
    async def run(self, run: Run) -> None: ...


class NoRuntime:
    """What runs the agent when no ``[runtime] command`` is configured: nothing, so each Run fails."""

    async def run(self, run: Run) -> None:
        raise RunFailed("no agent program is configured (set [runtime] command in gateway.toml)")


def agent_server_url(address: Address) -> str:
    """The URL an agent program on this host reaches the Agent server at (a wildcard bind means loopback)."""
    return f"http://{address.connectable}"


def from_settings(settings: Settings) -> Runtime:
    """The runtime ``[runtime] mode`` names for ``[runtime] command``, confined as ``runtime.sandbox`` says,
    or :class:`NoRuntime` when no command is set.

    Raises :class:`agent_gateway.sandbox.bubblewrap.SandboxError` when
    ``runtime.sandbox = "bubblewrap"`` and the program cannot be confined.
    """
    if settings.runtime_command is None:
        return NoRuntime()
    kind = PersistentRuntime if settings.runtime_mode == "persistent" else CommandRuntime
    return kind(
        settings.runtime_command,
        agent_server_url=agent_server_url(settings.agent_listen),
        workdir=settings.runtime_workdir,
        sandbox=choose.choose(settings, settings.agent_listen),
    )
