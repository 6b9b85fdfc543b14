"""Session memory: each Session's earlier turns, one file per Session in the Workspace.

A Session file holds the model's messages as pydantic-ai serialises them
(``ModelMessagesTypeAdapter``), so they go back to the model as ordinary earlier
turns. It is written whole to a temporary file and renamed over the old one, so
a reader (or a crash) never sees half of it. It keeps the last ``max_exchanges``
exchanges: an exchange is one Run's turns, from its Prompt to its final answer,
tool calls and their results included; older exchanges are dropped whole, so a
tool call is never kept without its result. A file that does not parse is
renamed aside (``NAME.corrupt-<time>``) with a warning and the Session starts
fresh.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import pydantic
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, UserPromptPart

# A Session name longer than this (quoted) is stored under its SHA-256 instead: file names end at 255 bytes.
MAX_NAME_CHARS = 200

logger = logging.getLogger(__name__)


class SessionStore:
    """The Session files in ``directory``, each keeping at most ``max_exchanges`` exchanges."""

    def __init__(self, directory: Path, max_exchanges: int) -> None:
        self.directory = directory
        self.max_exchanges = max_exchanges

    def path(self, session: str) -> Path:
        """The file of ``session``: its name quoted (so no name can leave the folder), or its digest."""
        name = quote(session, safe="")
        if len(name) > MAX_NAME_CHARS:
            name = hashlib.sha256(session.encode()).hexdigest()
        return self.directory / f"{name}.json"

    def load(self, session: str) -> list[ModelMessage]:
        """The Session's earlier turns; none for a new Session or a corrupt file (set aside)."""
        path = self.path(session)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            return ModelMessagesTypeAdapter.validate_json(data)
        except pydantic.ValidationError:
            aside = path.with_name(f"{path.name}.corrupt-{time.time_ns()}")
            os.replace(path, aside)
            # The file's name only: its content is the Users' words.
            logger.warning("Session file %s does not parse; set aside as %s, the Session starts fresh", path, aside)
            return []

    def save(self, session: str, messages: Sequence[ModelMessage]) -> None:
        """Replace the Session's file with ``messages``, bounded, atomically."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(session)
        data = ModelMessagesTypeAdapter.dump_json(list(bounded(messages, self.max_exchanges)))
        descriptor, temporary = tempfile.mkstemp(dir=self.directory, prefix=f".{path.name}.")
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
            # No fsync (8 ms a Run on a busy disk): the rename is atomic against a crash of the program;
            # after a power loss the file may be empty or old, and an empty one is set aside on load.
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise


def bounded(messages: Sequence[ModelMessage], max_exchanges: int) -> Sequence[ModelMessage]:
    """The last ``max_exchanges`` exchanges of ``messages``, each starting at a request carrying a Prompt."""
    starts = [index for index, message in enumerate(messages) if _starts_exchange(message)]
    if len(starts) <= max_exchanges:
        return messages
    return messages[starts[-max_exchanges]:]


def _starts_exchange(message: ModelMessage) -> bool:
    return isinstance(message, ModelRequest) and any(isinstance(part, UserPromptPart) for part in message.parts)
