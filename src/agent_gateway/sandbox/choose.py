"""Whether the agent program runs confined: ``runtime.sandbox`` against what this machine can do.

``"auto"`` (the default) confines when ``bwrap`` is found and a confined
program starts, and otherwise starts unconfined with one WARNING line saying
why and how to fix it; ``"bubblewrap"`` refuses to start, with one line
(:class:`SandboxError`), when it cannot confine; ``"none"`` runs the program
unconfined, saying so at INFO. The check runs once, when the Signal Worker's
process starts, before any Run.
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
        if mode == "bubblewrap":
            raise SandboxError(f'runtime.sandbox = "bubblewrap": the agent program cannot be confined: {exc}') from None
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
    """The gateway's secrets: its config file and folder, its signing key, its SQLite database files."""
    paths: list[Path] = []
    if settings.config_file is not None:
        paths += [settings.config_file, settings.config_file.parent]
    if settings.signing_key_file is not None:
        paths.append(settings.signing_key_file)
    database = sa.make_url(settings.database_url).database
    if settings.database_url.startswith("sqlite") and database and database != ":memory:":
        file = Path(database)
        paths += [file.with_name(file.name + suffix) for suffix in ("", "-wal", "-shm", "-journal", ".serve-lock")]
    return paths
