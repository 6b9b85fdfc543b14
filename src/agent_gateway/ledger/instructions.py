"""The instructions: everything the gateway gives the agent besides Signals, as the ledger records
them (``ledger.entries``). Secrets never appear: of ``runtime.env_pass`` only the names.

The files read here (the program, its script, the reference LLM agent's instructions) may lie in
the Workspace or another folder the agent writes (``runtime.sandbox_rw``), and the gateway reads
them with its own rights and publishes the instructions text: there, a symbolic link the agent
made could point at the signing key, and a FIFO or ``/dev/zero`` would hang the start. So every
path is resolved one component at a time from a descriptor of the folder before it, following
links only where the agent cannot write, and only regular files are read, the instructions text
up to :data:`INSTRUCTIONS_MAX_BYTES`; anything else there stops the start with one line
(:class:`InstructionsError`).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import io
import os
import shutil
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_gateway.agent.llm.__main__ import parser
from agent_gateway.config import Settings
from agent_gateway.errors import GatewayError
from agent_gateway.signals.handlers import Handlers, TemplateHandler

# The reference LLM agent, as ``runtime.command`` runs it: ``python -m agent_gateway.agent.llm ...``.
LLM_AGENT_MODULE = "agent_gateway.agent.llm"
# The instructions text is published in the ledger whole: a bound on what one entry holds.
INSTRUCTIONS_MAX_BYTES = 1024 * 1024
# Files are hashed in pieces of this size, never read whole.
CHUNK_BYTES = 1024 * 1024
# Symbolic links followed (where the agent cannot write) in one path before giving up, as the kernel's.
MAX_LINKS = 40


class InstructionsError(GatewayError):
    """A file the instructions name cannot be read safely: the Signal Worker does not start."""


def collect(settings: Settings, handlers: Handlers, runtime: object) -> dict[str, Any]:
    """The instructions of a gateway with these ``settings``, Signal ``handlers`` and ``runtime``
    (as they are once the operator's Python setup has run)."""
    command = list(settings.runtime_command or ())
    files, agent = _read(settings, command)
    return {
        "handlers": [_handler(kind, handlers.get(kind)) for kind in handlers.kinds()],
        "runtime": {
            "program": _importable(type(runtime)),
            "command": command,
            "mode": settings.runtime_mode,
            "files": files,
        },
        "confinement": {
            "sandbox": settings.runtime_sandbox,
            "allowHosts": [str(host) for host in settings.runtime_allow_hosts],
            "envPass": list(settings.runtime_env_pass),
        },
        "agent": agent,
    }


def check(settings: Settings) -> int:
    """Read the files the instructions publish (those ``runtime.command`` names, the reference LLM
    agent's instructions file) as :func:`collect` does, raising :class:`InstructionsError` for one
    that cannot be read safely: ``serve`` stops before it migrates or forks, ``doctor`` says so.
    How many files the command names. The Signal Worker's start reads them again (the agent may
    have changed its Workspace since)."""
    files, _ = _read(settings, list(settings.runtime_command or ()))
    return len(files)


def _read(settings: Settings, command: list[str]) -> tuple[dict[str, str], dict[str, Any] | None]:
    """The SHA-256 of each file ``command`` names, and the reference LLM agent's instructions."""
    workdir, writable = settings.runtime_workdir, _agents_folders(settings)
    return _files(command, workdir, writable), _llm_agent(command, workdir, writable, settings.scheduler_agent_routes)


def _handler(kind: str, handler: object) -> dict[str, Any]:
    if isinstance(handler, TemplateHandler):
        return {"kind": kind, "template": handler.template_text, "session": handler.session_text}
    module = sys.modules.get(type(handler).__module__)
    source = None
    try:
        source = hashlib.sha256(Path(inspect.getfile(module)).read_bytes()).hexdigest() if module else None  # type: ignore[arg-type]
    except (TypeError, OSError):  # a module without a source file (built in, or made at run time)
        pass
    return {"kind": kind, "python": _importable(type(handler)), "sourceSha256": source}


def _importable(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _agents_folders(settings: Settings) -> list[Path]:
    """The folders the agent program can write (the Workspace, ``runtime.sandbox_rw``), as real paths:
    the operator's own links on the way to them are followed, none below them."""
    folders = [settings.runtime_workdir] if settings.runtime_workdir is not None else []
    return [Path(os.path.realpath(folder)) for folder in [*folders, *settings.runtime_sandbox_rw]]


def _files(command: list[str], workdir: Path | None, writable: Sequence[Path]) -> dict[str, str]:
    """Every argument of ``command`` that names a file (the program, its script), with its SHA-256."""
    digests = {arg: _file_sha256(arg, workdir, writable, program=index == 0) for index, arg in enumerate(command)}
    return {arg: digest for arg, digest in digests.items() if digest is not None}


def _file_sha256(arg: str, workdir: Path | None, writable: Sequence[Path], *, program: bool) -> str | None:
    """The SHA-256 of the file ``arg`` names: the program is looked up on PATH, as the runtime
    runs it; a relative path is in the runtime's workdir. None when it names no file."""
    path = Path(arg)
    if program and not path.parent.parts:
        found = shutil.which(arg)
        path = Path(found) if found else path
    elif not path.is_absolute() and workdir is not None:
        path = workdir / path
    fd = _open_regular(path, writable, "runtime.command's file")
    if fd is None:
        return None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _open_regular(path: Path, writable: Sequence[Path], what: str) -> int | None:
    """A descriptor of the regular file at ``path``, none of whose components below a ``writable``
    folder is a symbolic link; None when no file is there (nothing, a folder, or something other
    than a file outside those folders). Raises :class:`InstructionsError` for a link or anything
    but a regular file below them. Race-free: each component is opened from its folder's
    descriptor without following a link, so the agent cannot swap one in between check and read."""
    # Not normalised: ".." is resolved as the kernel would, from the folder reached so far.
    parts = list(Path(os.getcwd(), path).parts[1:])
    folder = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    links = 0
    try:
        while parts:
            part = parts.pop(0)
            try:
                found = os.stat(part, dir_fd=folder, follow_symlinks=False)
            except OSError:  # nothing there, or not reachable: it names no file
                return None
            here = _descriptor_path(folder)
            agents = _below(here, writable)
            if stat.S_ISLNK(found.st_mode):
                if agents:
                    link = f": {here / part}" if parts else ""  # a folder on the way, or the file itself
                    raise InstructionsError(
                        f"{what} {path}{link} is a symbolic link in a folder the agent can write, which the gateway "
                        "never follows (the agent could point one at the gateway's key); put the file itself there"
                    )
                links += 1
                if links > MAX_LINKS:
                    return None
                target = os.readlink(part, dir_fd=folder)
                if os.path.isabs(target):
                    folder = _reopen(folder, "/", None)
                parts = [*Path(target).parts[1 if os.path.isabs(target) else 0 :], *parts]
                continue
            if parts:
                if not stat.S_ISDIR(found.st_mode):
                    return None
                try:
                    folder = _reopen(folder, part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
                except OSError:  # swapped for a link or removed since: nothing is followed
                    return None
                continue
            return _open_last(folder, part, found, agents, f"{what} {path}")
        return None  # the path is / itself
    finally:
        os.close(folder)


def _open_last(folder: int, name: str, found: os.stat_result, agents: bool, what: str) -> int | None:
    """The descriptor of the regular file ``name`` in ``folder`` (``found`` is its lstat), per :func:`_open_regular`."""
    if stat.S_ISDIR(found.st_mode):
        return None
    if stat.S_ISREG(found.st_mode):
        try:
            # Non-blocking: should it have become a FIFO since, the open does not wait for a writer.
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
        except OSError:  # swapped for a link or removed since: nothing is read
            return None
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
        os.close(fd)
    if agents:
        raise InstructionsError(
            f"{what} is not a regular file, the only kind the gateway reads from the agent's folders"
        )
    return None


def _reopen(folder: int, name: str, flags: int | None) -> int:
    """``name`` opened from ``folder`` (with ``flags``; None: the root) in place of ``folder``, which is closed."""
    opened = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) if flags is None else os.open(
        name, flags | os.O_CLOEXEC, dir_fd=folder
    )
    os.close(folder)
    return opened


def _descriptor_path(fd: int) -> Path:
    """Where the folder open as ``fd`` is, links resolved (Linux's ``/proc/self/fd``)."""
    return Path(os.readlink(f"/proc/self/fd/{fd}"))


def _below(folder: Path, writable: Sequence[Path]) -> bool:
    return any(folder.is_relative_to(outer) for outer in writable)


def _llm_agent(
    command: list[str], workdir: Path | None, writable: Sequence[Path], schedules: bool
) -> dict[str, Any] | None:
    """The reference LLM agent's instructions text, model and tools, when the command runs it."""
    try:
        at = command.index("-m")
    except ValueError:
        return None
    if command[at + 1 : at + 2] != [LLM_AGENT_MODULE]:
        return None
    try:
        args = parser().parse_args(command[at + 2 :])
    except SystemExit:  # the agent would refuse to start: nothing it is told
        return None
    assert isinstance(args, argparse.Namespace)
    instructions = args.instructions if args.instructions.is_absolute() or workdir is None else workdir / args.instructions
    text = _instructions_text(instructions, writable)
    # The MCP SDK, which the tools' definitions import: loaded only where the LLM agent runs.
    from agent_gateway.mcp import tools

    return {"instructions": text, "model": args.model, "tools": sorted(tools.available(schedules=schedules))}


def _instructions_text(path: Path, writable: Sequence[Path]) -> str | None:
    """The reference LLM agent's instructions file, as the ledger publishes it; None when there is
    none (or it is not UTF-8: the agent would fail on it too)."""
    what = "the reference LLM agent's --instructions file"
    fd = _open_regular(path, writable, what)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as file:
        # One byte past the bound tells a file that grew since its size was read.
        data = file.read(INSTRUCTIONS_MAX_BYTES + 1)
    if len(data) > INSTRUCTIONS_MAX_BYTES:
        size = f"{INSTRUCTIONS_MAX_BYTES // 1024 // 1024} MiB"
        raise InstructionsError(f"{what} {path} is larger than {size}, which the ledger does not publish")
    try:
        # Universal newlines, as the agent reads it (Path.read_text).
        return io.StringIO(data.decode("utf-8"), newline=None).read()
    except UnicodeDecodeError:
        return None
