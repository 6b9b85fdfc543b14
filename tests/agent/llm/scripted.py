"""A scripted model for the reference LLM agent: pydantic-ai's FunctionModel calls ``respond``.

The agent takes it as ``--model function:tests.agent.llm.scripted:respond`` (the
testing hook, enabled by ``LLM_AGENT_FUNCTION_MODELS=1``). It reads the latest
Prompt, as the gateway's Handlers write it, and calls the gateway's real MCP
tools as a model would:

- ``A message from user ID:`` then
  - ``decide: S`` publishes the Decision S, then tells the User its number;
  - ``remind me in N seconds: NOTE`` sets a once Schedule N seconds ahead with
    ``{"userId", "note"}`` as its data, then says so to the User;
  - ``badcall: TEXT`` first calls send_message with a malformed userId, then,
    given the tool's error, calls it right, quoting the error;
  - ``instructions?`` sends the User the instructions the model was given;
  - ``loop`` reads the User's Messages until the agent's limits stop it;
  - anything else is echoed, with the earlier Prompts of the Session the model was
    given (so a test sees the model's memory in the User's log).
- ``The Schedule NAME fired ... Its data: {...}`` messages ``data.userId`` ``Reminder: NOTE``.

After its last tool call it ends the Run with a plain-text answer.
"""

from __future__ import annotations

import datetime
import json
import re
import uuid
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo

MESSAGE = re.compile(r"A message from user (?P<user>\S+):\n\n(?P<text>.*)", re.S)
FIRED = re.compile(r"The Schedule (?P<name>\S+) fired .*Its data: (?P<data>.*)", re.S)
REMIND = re.compile(r"remind me in (?P<seconds>\d+) seconds: (?P<note>.*)", re.S)


def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    prompts = [part.content for part in _parts(messages, UserPromptPart)]
    prompt = str(prompts[-1])
    done = _this_run(messages)
    calls = [part for part in done if isinstance(part, ToolCallPart)]
    results = [part for part in done if isinstance(part, (ToolReturnPart, RetryPromptPart))]
    if message := MESSAGE.fullmatch(prompt):
        if message["text"] == "instructions?":
            return _call("send_message", userId=message["user"], text=info.instructions) if not calls else _text("ok")
        return _answer(message["user"], message["text"], prompts[:-1], calls, results)
    if fired := FIRED.fullmatch(prompt):
        data = json.loads(fired["data"])
        if not calls:
            return _call("send_message", userId=data["userId"], text=f"Reminder: {data['note']}")
        return _text("reminded")
    return _text(f"no script for {prompt!r}")


def _answer(
    user: str, text: str, earlier: list[Any], calls: list[ToolCallPart], results: list[Any]
) -> ModelResponse:
    if text.startswith("decide: "):
        if not calls:
            return _call("publish_decision", statement=text.removeprefix("decide: "))
        if len(calls) == 1:
            decision = _content(results[-1])
            return _call("send_message", userId=user, text=f"published Decision {decision['seq']}")
        return _text("decided")
    if remind := REMIND.fullmatch(text):
        if not calls:
            at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=int(remind["seconds"]))
            return _call(
                "put_schedule",
                name=f"remind-{uuid.uuid4().hex[:12]}",
                spec={"kind": "once", "at": at.isoformat(timespec="milliseconds").replace("+00:00", "Z")},
                data={"userId": user, "note": remind["note"]},
            )
        if len(calls) == 1:
            return _call("send_message", userId=user, text="I will remind you")
        return _text("scheduled")
    if text.startswith("badcall: "):
        if not calls:
            return _call("send_message", userId="not-a-user-id", text=text)
        if len(calls) == 1:
            error = _error(results[-1])
            return _call("send_message", userId=user, text=f"after a tool error: {error}")
        return _text("recovered")
    if text == "loop":
        return _call("read_messages", userId=user)
    if not calls:
        return _call("send_message", userId=user, text=f"echo: {text} | earlier: {' / '.join(map(str, earlier))}")
    return _text("answered")


def _this_run(messages: list[ModelMessage]) -> list[Any]:
    """The parts after the latest Prompt: this Run's tool calls and their results so far."""
    parts: list[Any] = []
    for message in reversed(messages):
        if isinstance(message, ModelRequest) and any(isinstance(p, UserPromptPart) for p in message.parts):
            break
        parts[:0] = message.parts
    return parts


def _parts(messages: list[ModelMessage], kind: type) -> list[Any]:
    return [part for message in messages for part in message.parts if isinstance(part, kind)]


def _content(result: Any) -> Any:
    content = result.content
    return json.loads(content) if isinstance(content, str) else content


def _error(result: Any) -> str:
    """The tool error the model was shown, on one line."""
    text = result.model_response() if isinstance(result, RetryPromptPart) else str(result.content)
    return " ".join(text.split())[:300]


def _call(tool: str, **args: Any) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool, args)])


def _text(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(text)])
