"""What a command loads: only the chat needs the line editor."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes


def test_other_commands_do_not_import_prompt_toolkit() -> None:
    # -X importtime lists every module the process imports, on stderr.
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "agent_gateway", "--help"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "chat" in result.stdout
    assert "agent_gateway.cli.chat\n" in result.stderr  # the command is registered
    assert "prompt_toolkit" not in result.stderr
