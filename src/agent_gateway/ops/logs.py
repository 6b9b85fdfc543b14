"""Log output: plain text or one JSON object per line (``log.format``), and the access log.

A JSON line carries ``time``, ``level``, ``logger``, ``message`` and the
structured fields the call passed with ``extra=`` (``action``, ``run``,
``signal``, ``schedule``, ``status``, ``duration_ms``...). Log calls never pass
a secret, a Token or a Statement, in either format.

Some routes log a line per request (``POST /sign`` must, by the spec): the
lines are cheap to make (neither the caller's line nor the thread or process
names looked up; a text line's date formatted once per second) and the lines of one turn of the event
loop reach stderr in one write (:class:`TurnHandler`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

from agent_gateway import clock

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# One line per answered request (``log.access``); see ops/observe.py.
ACCESS_LOGGER = "agent_gateway.access"
# Attributes every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": clock.format_instant(datetime.fromtimestamp(record.created, UTC)),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """:data:`TEXT_FORMAT`, whose date and time to the second are formatted once per second."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        second = int(record.created)
        cached = self._second
        if cached[0] != second:  # one tuple, replaced whole: safe from any thread
            cached = self._second = (second, time.strftime("%Y-%m-%d %H:%M:%S", self.converter(second)))
        return f"{cached[1]},{int(record.msecs):03d}"


class TurnHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler whose lines logged in one turn of an event loop are written together, at
    the end of that turn: one write, not a write and a flush per line.

    A line logged outside a running loop (another thread, start-up, the CLI) is written at
    once, after the lines still waiting, so the order holds. Lines still waiting are
    written before this process forks (:func:`flush`: the child would write them again),
    before it ends with ``os._exit`` and when logging shuts down.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._waiting: list[str] = []
        # The loop that will write the lines waiting; a loop closed before it did is replaced.
        self._writer: asyncio.AbstractEventLoop | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._waiting.append(line)  # Handler.handle holds this handler's lock
        if loop is None:
            self.flush()
        elif self._writer is not loop:
            self._writer = loop
            loop.call_soon(self.flush)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            lines, self._waiting, self._writer = self._waiting, [], None
            try:
                if lines:
                    self.stream.write("\n".join(lines) + "\n")
                self.stream.flush()
            except Exception:  # stderr closed: as StreamHandler.emit, report and go on
                self.handleError(logging.makeLogRecord({"msg": "%d log lines", "args": (len(lines),)}))


def flush() -> None:
    """Write the log lines still waiting (before a fork or an ``os._exit``)."""
    for handler in logging.getLogger().handlers:
        handler.flush()


os.register_at_fork(before=flush)


def configure(level: str, format: str = "text") -> None:
    """Send the gateway's logs to stderr at ``level`` in ``format`` (``text`` or ``json``)."""
    # No format of the gateway's shows them, and each costs a lookup per line; the caller's
    # file and line cost a walk up the stack (the logging HOWTO's "Optimization" section).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None
    handler = TurnHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # uvicorn's and alembic's own start-up chatter repeats what the gateway logs once; httpx
    # and the MCP SDK would log every MCP request and its tool's request (log.access's job).
    for noisy in ("uvicorn.error", "alembic", "httpx", "mcp"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
