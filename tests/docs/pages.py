"""What the documentation shows a reader to run: its shell code blocks, and the
``agent-gateway`` invocations in them, checked against the real command tree."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import typer

from agent_gateway.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SHELLS = {"sh", "bash", "shell", "console"}
OPERATORS = set("();<>|&")


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def shell_blocks(text: str) -> Iterator[str]:
    """The bodies of the shell code blocks of a Markdown text, in order."""
    for language, body in FENCE.findall(text):
        if language in SHELLS:
            yield body


def shell_lines(block: str) -> Iterator[str]:
    """One line per command line: continuations joined, a console's ``$ `` prompt dropped."""
    for line in block.replace("\\\n", " ").splitlines():
        yield line.removeprefix("$ ")


def invocations(line: str) -> Iterator[list[str]]:
    """The arguments of every ``agent-gateway`` on a shell line (in ``$(...)`` and pipes too)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    for at, token in enumerate(tokens):
        if token == "agent-gateway" or token.endswith("/agent-gateway"):
            args = []
            for argument in tokens[at + 1 :]:
                if set(argument) <= OPERATORS:
                    break
                args.append(argument)
            yield args


def parse(args: list[str]) -> str:
    """Parse ``agent-gateway ARGS`` as the real command line would, down to the command that
    runs, without running it; its path (``agent-gateway users add``). A usage error raises
    click's UsageError (an unknown command or option, a missing argument, a bad value)."""
    command = typer.main.get_command(app)
    ctx = command.make_context("agent-gateway", list(args))
    while hasattr(command, "resolve_command"):
        # What a group has not parsed itself (its subcommand and that one's arguments).
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            break
        name, command, rest = command.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx)
    return ctx.command_path
