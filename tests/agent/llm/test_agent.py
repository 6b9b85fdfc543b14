"""The reference LLM agent end to end: a real gateway (``init --agent llm``, ``serve``), the agent
program it starts, and a scripted model (pydantic-ai's FunctionModel, ``scripted.py``) making real
tool calls through the gateway's real MCP server at ``/mcp``.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.agent.llm import served_llm
from tests.signatures.helpers import independent_verify

pytestmark = pytest.mark.e2e


async def test_each_user_is_answered_in_their_log_with_their_own_sessions_memory_and_the_instructions(
    tmp_path: Path, database_url: str
) -> None:
    directory = tmp_path / "deployment"
    variables = served_llm.env(database_url)
    served_llm.init(directory, "--model", served_llm.SCRIPTED, extra=variables)
    sessions = directory / "workspace" / "sessions"
    with served_llm.gateway(directory, variables) as gateway:
        alice, bob = served_llm.users(gateway, 2)
        await alice.say("hello")
        assert await alice.answers(output=gateway.output) == ["echo: hello | earlier: "]
        await bob.say("hi")
        await alice.say("again")
        # The second Message of a Session sees the first exchange in the model's input; Bob's never does.
        [again] = await alice.answers(output=gateway.output)
        assert again == f"echo: again | earlier: A message from user {alice.id}:\n\nhello"
        assert await bob.answers(output=gateway.output) == ["echo: hi | earlier: "]
        assert sorted(p.name for p in sessions.iterdir()) == sorted([f"user_{alice.id}.json", f"user_{bob.id}.json"])
        assert bob.id not in sessions.joinpath(f"user_{alice.id}.json").read_text()

        # A corrupt Session file is set aside with a warning; that Session starts fresh, Bob's goes on.
        sessions.joinpath(f"user_{alice.id}.json").write_text("{not json")
        await alice.say("after")
        assert await alice.answers(output=gateway.output) == ["echo: after | earlier: "]
        assert [p.name for p in sessions.iterdir() if ".corrupt-" in p.name] != []
        await bob.say("still")
        [still] = await bob.answers(output=gateway.output)
        assert still == f"echo: still | earlier: A message from user {bob.id}:\n\nhi"
        runs = await served_llm.run_settled(gateway, 5)
        assert {run["state"] for run in runs} == {"done"}
        assert {run["session"] for run in runs} == {f"user_{alice.id}", f"user_{bob.id}"}

        # The instructions are read at each Run: an edit takes effect without a restart.
        instructions = directory / "workspace" / "instructions.md"
        await alice.say("instructions?")
        [first] = await alice.answers(output=gateway.output)
        assert first.startswith("You are the shared agent of this gateway") and "send_message" in first
        assert "The time now is 20" in first
        instructions.write_text("You are Ada, the picnic planner.\n")
        await alice.say("instructions?")
        [edited] = await alice.answers(output=gateway.output)
        assert edited.startswith("You are Ada, the picnic planner.\n\nThe time now is ")
        # Without its instructions file, a Run fails saying so; the agent goes on.
        instructions.unlink()
        await alice.say("instructions?")
        [failed] = await served_llm.run_settled(gateway, 1)
        assert (failed["state"], failed["error"]) == ("failed", "instructions instructions.md: No such file or directory")
        instructions.write_text("Back.\n")
        await alice.say("instructions?")
        assert (await alice.answers(output=gateway.output))[0].startswith("Back.")
    assert "hello" not in gateway.output()  # Statement and Message text never reach the log


async def test_the_agent_publishes_decisions_sets_reminders_and_recovers_from_bad_tool_calls(
    tmp_path: Path, database_url: str
) -> None:
    directory = tmp_path / "deployment"
    variables = served_llm.env(database_url)
    served_llm.init(directory, "--model", served_llm.SCRIPTED, extra=variables)
    with served_llm.gateway(directory, variables) as gateway:
        [user] = served_llm.users(gateway, 1)

        # A Decision, published through the MCP tool, verifies against the JWK Set.
        await user.say("decide: the picnic is on Saturday")
        [published] = await user.answers(output=gateway.output)
        seq = int(published.removeprefix("published Decision "))
        async with httpx.AsyncClient(base_url=gateway.public_url, timeout=60) as public:
            decision = (await public.get(f"/decisions/{seq}", headers=user.headers)).json()
            jwks = (await public.get("/jwks.json")).json()
        assert decision["statement"] == "the picnic is on Saturday"
        payload = next(
            independent_verify(decision["jws"], key) for key in jwks["keys"]
        )
        assert payload == {"seq": seq, "createdAt": decision["createdAt"], "statement": decision["statement"]}

        # A reminder sets a Schedule; its fire runs the agent, which messages the User.
        await user.say("remind me in 2 seconds: stretch your legs")
        assert await user.answers(2, output=gateway.output) == ["I will remind you", "Reminder: stretch your legs"]

        # A tool called with bad arguments answers the model an error; it calls again, right.
        await user.say("badcall: hello")
        [recovered] = await user.answers(output=gateway.output)
        assert recovered.startswith("after a tool error: ") and "userId" in recovered

        # The agent's limits end a Run that would go on forever, with one line; the next Run works.
        await user.say("loop")
        [looped] = await served_llm.run_settled(gateway, 1)
        assert looped["state"] == "failed"
        assert looped["error"] in (
            "stopped at a limit of the agent: The next request would exceed the request_limit of 10",
            "stopped at a limit of the agent: The next tool call(s) would exceed the tool_calls_limit of 20 "
            "(tool_calls=20)",
        )
        await user.say("still there?")
        assert await user.answers(output=gateway.output) != []

