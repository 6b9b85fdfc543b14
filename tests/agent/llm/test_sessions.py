"""Session memory (agent/llm/sessions.py): one file per Session, bounded, atomic, corrupt files set aside."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from agent_gateway.agent.llm import sessions
from agent_gateway.agent.llm.sessions import SessionStore


def exchange(n: int, *, tool: bool = False) -> list[ModelMessage]:
    """One Run's turns: the Prompt, perhaps a tool call and its result, the final answer."""
    turns: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(f"prompt {n}")])]
    if tool:
        turns += [
            ModelResponse(parts=[ToolCallPart("send_message", {"userId": "u", "text": f"t{n}"}, tool_call_id=f"c{n}")]),
            ModelRequest(parts=[ToolReturnPart("send_message", {"seq": n}, tool_call_id=f"c{n}")]),
        ]
    return turns + [ModelResponse(parts=[TextPart(f"answer {n}")])]


def prompts(messages: list[ModelMessage]) -> list[str]:
    return [p.content for m in messages for p in m.parts if isinstance(p, UserPromptPart)]  # type: ignore[misc]


def test_a_session_reads_back_what_was_saved(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions", max_exchanges=20)
    assert store.load("user_1") == []
    history = exchange(1, tool=True) + exchange(2)
    store.save("user_1", history)
    assert store.load("user_1") == history
    assert store.load("user_2") == []  # another Session, another file
    assert sorted(p.name for p in (tmp_path / "sessions").iterdir()) == ["user_1.json"]


def test_the_oldest_exchanges_are_dropped_whole(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, max_exchanges=3)
    history = [m for n in range(1, 8) for m in exchange(n, tool=n % 2 == 0)]
    store.save("s", history)
    kept = store.load("s")
    assert prompts(kept) == ["prompt 5", "prompt 6", "prompt 7"]
    # It starts at a Prompt, and every tool call it keeps has its result.
    assert isinstance(kept[0], ModelRequest) and isinstance(kept[0].parts[0], UserPromptPart)
    calls = [p.tool_call_id for m in kept for p in m.parts if isinstance(p, ToolCallPart)]
    returns = [p.tool_call_id for m in kept for p in m.parts if isinstance(p, ToolReturnPart)]
    assert calls == returns == ["c6"]


def test_the_default_keeps_at_least_twenty_exchanges(tmp_path: Path) -> None:
    from agent_gateway.agent.llm.agent import Settings

    assert Settings(model="x").history >= 20
    history = [m for n in range(25) for m in exchange(n)]
    assert prompts(list(sessions.bounded(history, 20))) == [f"prompt {n}" for n in range(5, 25)]


def test_a_corrupt_session_file_is_set_aside_and_the_session_starts_fresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SessionStore(tmp_path, max_exchanges=20)
    store.path("user_1").write_text('[{"kind": "request", "parts": "my secret words')
    with caplog.at_level(logging.WARNING):
        assert store.load("user_1") == []
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("user_1.json.corrupt-")]
    assert len(aside) == 1 and aside[0].read_text().endswith("my secret words")
    assert not store.path("user_1").exists()
    assert "set aside" in caplog.text and "secret words" not in caplog.text
    store.save("user_1", exchange(1))  # and the Session goes on
    assert prompts(store.load("user_1")) == ["prompt 1"]


def test_a_write_replaces_the_file_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SessionStore(tmp_path, max_exchanges=20)
    store.save("s", exchange(1))
    before = store.path("s").read_bytes()

    def crash(src: str, dst: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        store.save("s", exchange(1) + exchange(2))
    assert store.path("s").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temporary file left behind


@pytest.mark.parametrize("name", ["../escape", "a/b", ".", "..", "x" * 300, "ü space"])
def test_any_session_name_stays_in_the_folder(tmp_path: Path, name: str) -> None:
    store = SessionStore(tmp_path / "sessions", max_exchanges=20)
    path = store.path(name)
    assert path.parent == tmp_path / "sessions" and len(path.name) < 255
    store.save(name, exchange(1))
    assert prompts(store.load(name)) == ["prompt 1"]
    assert store.path(name + "2") != path
