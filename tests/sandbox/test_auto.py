"""The default, runtime.sandbox = "auto", on a fresh machine (bwrap hidden from PATH), in process:
only the bundled echo demo runs unconfined; every other agent program is refused in one line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from agent_gateway import config
from agent_gateway.sandbox import choose
from agent_gateway.sandbox.bubblewrap import SandboxError

ECHO_DEMO = (sys.executable, "-m", "agent_gateway.runtimes.echo")
AGENT_SERVER = config.Address("127.0.0.1", 9999)
REFUSED = (
    'runtime.sandbox = "auto": the agent program cannot be confined (bwrap was not found on PATH), and only the '
    "bundled echo demo runs unconfined; install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or set "
    'runtime.sandbox = "none" to run it unconfined on purpose'
)


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without bubblewrap: nothing on PATH."""
    monkeypatch.setenv("PATH", "/nonexistent")


def settings(tmp_path: Path, command: tuple[str, ...], **changes: object) -> config.Settings:
    return config.Settings(token_ttl_ms=1, runtime_command=command, runtime_workdir=tmp_path / "workspace", **changes)  # type: ignore[arg-type]


def test_the_default_is_auto() -> None:
    assert config.Settings(token_ttl_ms=1).runtime_sandbox == "auto"


@pytest.mark.parametrize(
    "command",
    [
        (sys.executable, str(Path(__file__).parent / "trying_agent.py")),
        (sys.executable, "-m", "agent_gateway.agent.llm", "--model", "openai:gpt-4o"),
        ("/usr/bin/node", "-m", "agent_gateway.runtimes.echo"),  # not a Python: not the echo demo
        (sys.executable, "-m", "agent_gateway.runtimes.echo", "--more"),
    ],
    ids=["a-script", "the-llm-agent", "not-python", "more-arguments"],
)
def test_auto_without_bwrap_refuses_any_agent_but_the_echo_demo(
    no_bwrap: None, tmp_path: Path, command: tuple[str, ...]
) -> None:
    with pytest.raises(SandboxError) as raised:
        choose.choose(settings(tmp_path, command), AGENT_SERVER)
    assert str(raised.value) == REFUSED
    assert "\n" not in str(raised.value)
    with pytest.raises(SandboxError, match="only the bundled echo demo"):
        choose.confinement(settings(tmp_path, command))


def test_auto_without_bwrap_runs_the_echo_demo_unconfined_with_the_warning(
    no_bwrap: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agent_gateway.sandbox.choose"):
        assert choose.choose(settings(tmp_path, ECHO_DEMO), AGENT_SERVER) is None
    assert [r.getMessage() for r in caplog.records] == [
        "the agent program runs UNCONFINED, with the gateway's rights: bwrap was not found on PATH; "
        'install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or set runtime.sandbox = "none"'
    ]
    assert choose.confinement(settings(tmp_path, ECHO_DEMO)).startswith("the echo demo would run UNCONFINED: ")


def test_none_runs_any_agent_unconfined_on_purpose(no_bwrap: None, tmp_path: Path) -> None:
    command = (sys.executable, "-c", "pass")
    assert choose.choose(settings(tmp_path, command, runtime_sandbox="none"), AGENT_SERVER) is None
    assert choose.confinement(settings(tmp_path, command, runtime_sandbox="none")) == (
        'unconfined on purpose (runtime.sandbox = "none")'
    )


def test_bubblewrap_refuses_even_the_echo_demo(no_bwrap: None, tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match='^runtime.sandbox = "bubblewrap": the agent program cannot be confined'):
        choose.choose(settings(tmp_path, ECHO_DEMO, runtime_sandbox="bubblewrap"), AGENT_SERVER)


async def test_with_bwrap_auto_confines_whatever_the_program(bwrap: str, tmp_path: Path) -> None:
    command = (sys.executable, "-c", "pass")
    assert choose.confinement(settings(tmp_path, command)) == f"confined by bubblewrap ({bwrap})"
    sandbox = choose.choose(settings(tmp_path, command), AGENT_SERVER)
    assert sandbox is not None
    try:
        assert sandbox.bwrap == bwrap
    finally:
        await sandbox.close()
