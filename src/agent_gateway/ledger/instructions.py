"""The instructions: everything the gateway gives the agent besides Signals, as the ledger records
them (``ledger.entries``). Secrets never appear: of ``runtime.env_pass`` only the names."""

from __future__ import annotations

import argparse
import hashlib
import inspect
import shutil
import sys
from pathlib import Path
from typing import Any

from agent_gateway.agent.llm.__main__ import parser
from agent_gateway.config import Settings
from agent_gateway.signals.handlers import Handlers, TemplateHandler

# The reference LLM agent, as ``runtime.command`` runs it: ``python -m agent_gateway.agent.llm ...``.
LLM_AGENT_MODULE = "agent_gateway.agent.llm"


def collect(settings: Settings, handlers: Handlers, runtime: object) -> dict[str, Any]:
    """The instructions of a gateway with these ``settings``, Signal ``handlers`` and ``runtime``
    (as they are once the operator's Python setup has run)."""
    workdir = settings.runtime_workdir
    command = list(settings.runtime_command or ())
    return {
        "handlers": [_handler(kind, handlers.get(kind)) for kind in handlers.kinds()],
        "runtime": {
            "program": _importable(type(runtime)),
            "command": command,
            "mode": settings.runtime_mode,
            "files": _files(command, workdir),
        },
        "confinement": {
            "sandbox": settings.runtime_sandbox,
            "allowHosts": [str(host) for host in settings.runtime_allow_hosts],
            "envPass": list(settings.runtime_env_pass),
        },
        "agent": _llm_agent(command, workdir, settings.scheduler_agent_routes),
    }


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


def _files(command: list[str], workdir: Path | None) -> dict[str, str]:
    """Every argument of ``command`` that names a file (the program, its script), with its SHA-256."""
    digests = {arg: _file_sha256(arg, workdir, program=index == 0) for index, arg in enumerate(command)}
    return {arg: digest for arg, digest in digests.items() if digest is not None}


def _file_sha256(arg: str, workdir: Path | None, *, program: bool) -> str | None:
    """The SHA-256 of the file ``arg`` names: the program is looked up on PATH, as the runtime
    runs it; a relative path is in the runtime's workdir. None when it names no file."""
    path = Path(arg)
    if program and not path.parent.parts:
        found = shutil.which(arg)
        path = Path(found) if found else path
    elif not path.is_absolute() and workdir is not None:
        path = workdir / path
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    except OSError:
        return None


def _llm_agent(command: list[str], workdir: Path | None, schedules: bool) -> dict[str, Any] | None:
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
    try:
        text: str | None = instructions.read_text()
    except (OSError, UnicodeDecodeError):
        text = None
    # The MCP SDK, which the tools' definitions import: loaded only where the LLM agent runs.
    from agent_gateway.mcp import tools

    return {"instructions": text, "model": args.model, "tools": sorted(tools.available(schedules=schedules))}
