"""The 15-line agent of docs/agents/runtimes.md speaks the persistent runtime's protocol, as documented."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from agent_gateway.runtimes.persistent import PersistentRuntime
from agent_gateway.runtimes.runtime import RunFailed
from agent_gateway.store.queries.runs import Run

from tests.runtimes.test_echo import USER, AgentServer, agent_server

# Each test runs agent programs: a processes test (scripts/test --fast leaves it out).
pytestmark = pytest.mark.processes

__all__ = ["agent_server"]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "agents" / "runtimes.md"


def page_agent() -> str:
    text = PAGE.read_text()
    after = text.index("A complete agent in 15 lines")
    match = re.search(r"```python\n(.*?)```", text[after:], re.DOTALL)
    assert match is not None
    return match[1]


async def test_the_documented_agent_answers_and_fails_runs(agent_server: AgentServer, tmp_path: Path) -> None:
    source = page_agent()
    assert len(source.splitlines()) <= 15
    script = tmp_path / "agent.py"
    script.write_text(source)
    runtime = PersistentRuntime((sys.executable, str(script)), agent_server_url=agent_server.url)
    try:
        await runtime.run(Run("r-1", "s-1", f"user_{USER}", "hi", "running", None, None, None))
        with pytest.raises(RunFailed) as failed:
            await runtime.run(Run("r-2", "s-1", "run_r-2", "hi", "running", None, None, None))
        assert "not subscriptable" in failed.value.message
        agent_server.status = 404
        with pytest.raises(RunFailed) as refused:
            await runtime.run(Run("r-3", "s-1", f"user_{USER}", "again", "running", None, None, None))
        assert refused.value.message == "HTTP Error 404: Not Found"
    finally:
        await runtime.close()
    assert [body for _, body in agent_server.posts] == [
        {"userId": USER, "text": "you said: hi"},
        {"userId": USER, "text": "you said: again"},
    ]
