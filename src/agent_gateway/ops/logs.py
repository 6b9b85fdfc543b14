"""Log output: plain text or one JSON object per line (``log.format``), and the access log.

A JSON line carries ``time``, ``level``, ``logger``, ``message`` and the
structured fields the call passed with ``extra=`` (``action``, ``run``,
``signal``, ``schedule``, ``status``, ``duration_ms``...). Log calls never pass
a secret, a Token or a Statement, in either format.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

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


def configure(level: str, format: str = "text") -> None:
    """Send the gateway's logs to stderr at ``level`` in ``format`` (``text`` or ``json``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # uvicorn's and alembic's own start-up chatter repeats what the gateway logs once; httpx
    # and the MCP SDK would log every MCP request and its tool's request (log.access's job).
    for noisy in ("uvicorn.error", "alembic", "httpx", "mcp"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
