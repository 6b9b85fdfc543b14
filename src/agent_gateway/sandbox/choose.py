"""Whether the agent program runs confined: ``runtime.sandbox`` against what this machine can do.

``"auto"`` (the default) confines when ``bwrap`` is found and a confined
program starts. Where it cannot, it refuses to start (one line,
:class:`SandboxError`, naming what is missing and the two ways on) any agent
program but the bundled echo demo, which ships with the gateway and so may
run unconfined, with one WARNING line saying why and how to fix it: a fresh
machine without bubblewrap never runs an LLM agent, which anyone writing to
it can steer, with the gateway's rights unless the operator says so.
``"bubblewrap"`` refuses to start, with one line, when it cannot confine,
even the echo demo; ``"none"`` runs the program unconfined, saying so at
INFO. The check runs once, when the Signal Worker's process starts, before
any Run (and in ``agent-gateway doctor``, through :func:`confinement`).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path

import sqlalchemy as sa

from agent_gateway.config import Address, Settings
from agent_gateway.sandbox.bubblewrap import Sandbox, SandboxError

FIX = 'install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or set runtime.sandbox = "none"'
# The two ways on for an agent program "auto" will not run unconfined.
WAYS_ON = (
    'install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), '
    'or set runtime.sandbox = "none" to run it unconfined on purpose'
)
# The bundled echo demo, as `agent-gateway init` writes it: [<a python>, "-m", ECHO_DEMO].
ECHO_DEMO = "agent_gateway.runtimes.echo"

logger = logging.getLogger(__name__)


def choose(settings: Settings, agent_server: Address) -> Sandbox | None:
    """The sandbox for ``settings``' agent program, or None for an unconfined one."""
    mode = settings.runtime_sandbox
    if mode == "none":
        logger.info('the agent program runs unconfined (runtime.sandbox = "none")', extra={"action": "sandbox_off"})
        return None
    try:
        sandbox = _working(settings, agent_server)
    except SandboxError as exc:
        _refuse_unless_the_echo_demo(settings, exc)
        logger.warning(
            "the agent program runs UNCONFINED, with the gateway's rights: %s; %s", exc, FIX,
            extra={"action": "sandbox_unavailable"},
        )
        return None
    controllers = sandbox.group().controllers
    sandbox.discard_group()  # made again for the first Run; a gateway that never runs one leaves none
    logger.info(
        "the agent program runs confined by bubblewrap (%s); limits: rlimits%s", sandbox.bwrap,
        f" and a cgroup ({', '.join(controllers)})" if controllers else "", extra={"action": "sandbox_on"},
    )
    if os.geteuid() == 0 and "pids" not in controllers:
        logger.warning(
            "runtime.max_processes does not hold: the gateway runs as root, which the kernel exempts from "
            "RLIMIT_NPROC, and no pids cgroup could be made below the gateway's own",
            extra={"action": "sandbox_limits"},
        )
    return sandbox


def _refuse_unless_the_echo_demo(settings: Settings, exc: SandboxError) -> None:
    """Raise the one line ``serve`` stops with when ``settings``' program, which cannot be confined
    (``exc`` says why), may not run unconfined either; return for the echo demo under ``"auto"``."""
    if settings.runtime_sandbox == "bubblewrap":
        raise SandboxError(f'runtime.sandbox = "bubblewrap": the agent program cannot be confined: {exc}') from None
    if not is_echo_demo(settings.runtime_command):
        raise SandboxError(
            f'runtime.sandbox = "auto": the agent program cannot be confined ({exc}), and only the bundled '
            f"echo demo runs unconfined; {WAYS_ON}"
        ) from None


def is_echo_demo(command: tuple[str, ...] | None) -> bool:
    """Whether ``command`` runs the bundled echo demo: a Python interpreter, ``-m``, its module."""
    return (
        command is not None
        and len(command) == 3
        and Path(command[0]).name.startswith("python")
        and command[1:] == ("-m", ECHO_DEMO)
    )


def confinement(settings: Settings) -> str:
    """What ``settings``' agent program would run under, in one line, without logging or keeping
    anything (``agent-gateway doctor``); raises :class:`SandboxError` with the line ``serve``
    would stop with."""
    if settings.runtime_command is None:
        return "no agent program (runtime.command is not set)"
    if settings.runtime_sandbox == "none":
        return 'unconfined on purpose (runtime.sandbox = "none")'
    try:
        sandbox = _working(settings, settings.agent_listen)
    except SandboxError as exc:
        _refuse_unless_the_echo_demo(settings, exc)
        return f"the echo demo would run UNCONFINED: {exc}; {FIX}"
    sandbox.discard_group()
    return f"confined by bubblewrap ({sandbox.bwrap})"


def _working(settings: Settings, agent_server: Address) -> Sandbox:
    if not sys.platform.startswith("linux"):
        raise SandboxError(f"bubblewrap confines programs on Linux only (this is {sys.platform})")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxError("bwrap was not found on PATH")
    sandbox = Sandbox(
        bwrap,
        agent_server=agent_server,
        protected=protected(settings),
        read_only=settings.runtime_sandbox_ro,
        read_write=settings.runtime_sandbox_rw,
        allow_hosts=settings.runtime_allow_hosts,
        env_pass=settings.runtime_env_pass,
        max_processes=settings.runtime_max_processes,
        memory_limit_mb=settings.runtime_memory_limit_mb,
    )
    sandbox.check(settings.runtime_workdir)
    return sandbox


def protected(settings: Settings) -> list[Path]:
    """The gateway's secrets: its config file and folder, its signing key, its SQLite database files,
    and every other secret file the configuration names (the channels' keys, the webhooks' secrets),
    wherever each lies: a ``runtime.sandbox_ro``/``sandbox_rw`` path holding one is refused."""
    paths: list[Path] = []
    if settings.config_file is not None:
        paths += [settings.config_file, settings.config_file.parent]
    if settings.signing_key_file is not None:
        paths.append(settings.signing_key_file)
    database = sa.make_url(settings.database_url).database
    if settings.database_url.startswith("sqlite") and database and database != ":memory:":
        file = Path(database)
        paths += [file.with_name(file.name + suffix) for suffix in ("", "-wal", "-shm", "-journal", ".serve-lock")]
    for secret in (settings.matrix_access_token_file, settings.nostr_key_file):
        if secret is not None:
            paths.append(secret)
    paths += [endpoint.secret_file for endpoint in settings.webhooks if endpoint.secret_file is not None]
    return paths
