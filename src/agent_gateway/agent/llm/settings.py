"""The reference LLM agent's settings (its command-line options), apart from the agent so that the
gateway reads them without the ``llm`` extra (``ledger.instructions``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Settings:
    """The agent's settings (its command-line options, see ``__main__``)."""

    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    instructions: Path = Path("instructions.md")
    sessions: Path = Path("sessions")
    history: int = 20
    max_turns: int = 10
    max_tool_calls: int = 20
    timeout: float = 60.0
    retries: int = 2
