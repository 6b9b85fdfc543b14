"""The whole lifecycle with real subprocess agents under the command runtime, on both backends."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import httpx
import pytest

from agent_gateway.signals.handlers import Prompt
from agent_gateway.store.queries.signals import Signal

from tests.signals.conftest import AgentProgram, GatewayFactory, emit, finished, runs_of, signal_of

pytestmark = pytest.mark.processes

TABLES = {"task": {"template": "Do {{ what }} for {{ signal.kind }}", "session": "{{ who }}"}}


async def test_an_agent_that_exits_0_ends_its_run_and_signal_done(
    make_gateway: GatewayFactory, agent_program: AgentProgram, tmp_path: Path
) -> None:
    gateway = await make_gateway(
        runtime_command=agent_program.command("ok", "--session={session}", "{run_id}", "{signal_id}"),
        runtime_workdir=tmp_path / "ws",
        handlers=TABLES,
    )
    signal_id = await emit(gateway.store, "task", {"what": "the dishes", "who": "kitchen"})
    signal = await finished(gateway.store, signal_id)
    assert (signal.state, signal.error) == ("done", None)
    [run] = await runs_of(gateway.store, signal_id)
    assert (run.session, run.prompt, run.state, run.error) == ("kitchen", "Do the dishes for task", "done", None)
    [call] = agent_program.calls()
    assert call["argv"] == ["--session=kitchen", run.id, signal_id]
    assert call["stdin"] == "Do the dishes for task"
    assert call["cwd"] == str(tmp_path / "ws")
    assert call["env"]["AGENT_GATEWAY_RUN_ID"] == run.id
    assert call["env"]["AGENT_GATEWAY_SIGNAL_ID"] == signal_id
    assert call["env"]["AGENT_GATEWAY_SESSION"] == "kitchen"
    assert call["env"]["AGENT_SERVER_URL"] == f"http://{gateway.settings.agent_listen}"


async def test_an_agent_that_exits_3_fails_its_run_and_signal_with_stderr(
    make_gateway: GatewayFactory, agent_program: AgentProgram, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = await make_gateway(runtime_command=agent_program.command("fail"), handlers=TABLES)
    with caplog.at_level(logging.INFO, logger="agent_gateway"):
        signal_id = await emit(gateway.store, "task", {"what": "x", "who": "y"})
        await finished(gateway.store, signal_id)
    agent = httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.agent_app), base_url="http://agent")

    [run] = (await agent.get("/runs", params={"signalId": signal_id})).json()["runs"]
    expected = "the agent program exited with status 3; stderr ends with:\nsomething went wrong\nat the end"
    assert (run["state"], run["error"]) == ("failed", expected)
    signal = (await agent.get(f"/signals/{signal_id}")).json()
    assert signal["state"] == "failed"
    assert signal["error"] == f"Run {run['id']} (session y) failed: {expected}"
    await agent.aclose()
    # The operator sees it at WARNING: the program and what happened, then the Run's end.
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    program = agent_program.command("fail")[0]
    assert f"Run {run['id']} failed: the agent program exited with status 3 (program {program})" in warnings
    assert f"Run {run['id']} failed (Signal {signal_id}, session y)" in warnings


async def test_an_agent_that_cannot_be_executed_fails_the_run_not_the_worker(
    make_gateway: GatewayFactory, agent_program: AgentProgram, tmp_path: Path
) -> None:
    script = tmp_path / "agent"
    script.write_text("#!/bin/sh\n")
    script.chmod(stat.S_IRUSR)
    gateway = await make_gateway(runtime_command=(str(script),), handlers=TABLES)
    first = await emit(gateway.store, "task", {"what": "x", "who": "y"})
    second = await emit(gateway.store, "task", {"what": "x", "who": "y"})
    for signal_id in (first, second):
        signal = await finished(gateway.store, signal_id)
        [run] = await runs_of(gateway.store, signal_id)
        assert run.state == "failed"
        assert run.error.startswith("the agent program could not be started: [Errno 13] Permission denied")
        assert signal.state == "failed"


async def test_a_hanging_agent_holds_the_queue_until_it_exits(
    make_gateway: GatewayFactory, agent_program: AgentProgram
) -> None:
    """No timeout is imposed, and Runs are serial: the next Signal waits for the hanging Run."""
    gateway = await make_gateway(runtime_command=agent_program.command("hang"), handlers=TABLES)
    first = await emit(gateway.store, "task", {"what": "1", "who": "a"})
    second = await emit(gateway.store, "task", {"what": "2", "who": "b"})
    await agent_program.wait_started()
    [running] = await runs_of(gateway.store, first)
    assert running.state == "running" and running.started_at is not None and running.ended_at is None
    assert (await signal_of(gateway.store, first)).state == "processing"
    assert (await signal_of(gateway.store, second)).state == "pending"
    assert await runs_of(gateway.store, second) == []

    agent_program.release()
    assert (await finished(gateway.store, first)).state == "done"
    assert (await finished(gateway.store, second)).state == "done"
    assert [call["stdin"] for call in agent_program.calls()] == ["Do 1 for task", "Do 2 for task"]


async def test_fan_out_to_several_sessions_with_a_post_phase(
    make_gateway: GatewayFactory, agent_program: AgentProgram
) -> None:
    posts: list[bool] = []

    class EveryUser:
        def handle(self, signal: Signal) -> list[Prompt]:
            return [Prompt(f"remind {user}", f"user_{user}") for user in signal.payload["users"]]

        def post(self, signal: Signal, failed: bool) -> None:
            posts.append(failed)

    gateway = await make_gateway(register={"remind": EveryUser()}, runtime_command=agent_program.command("ok"))
    signal_id = await emit(gateway.store, "remind", {"users": ["u1", "u2", "u3"]})
    assert (await finished(gateway.store, signal_id)).state == "done"
    assert [(run.session, run.state) for run in await runs_of(gateway.store, signal_id)] == [
        ("user_u1", "done"),
        ("user_u2", "done"),
        ("user_u3", "done"),
    ]
    assert [call["env"]["AGENT_GATEWAY_SESSION"] for call in agent_program.calls()] == ["user_u1", "user_u2", "user_u3"]
    assert posts == [False]


async def test_without_a_configured_agent_program_runs_fail_saying_so(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(handlers=TABLES)
    signal_id = await emit(gateway.store, "task", {"what": "x", "who": "y"})
    signal = await finished(gateway.store, signal_id)
    [run] = await runs_of(gateway.store, signal_id)
    assert run.error == "no agent program is configured (set [runtime] command in gateway.toml)"
    assert signal.state == "failed"


async def test_stderr_that_no_database_can_store_is_made_storable(
    make_gateway: GatewayFactory, agent_program: AgentProgram
) -> None:
    """PostgreSQL refuses NUL in text: the error keeps its meaning, the worker does not fall over."""
    gateway = await make_gateway(runtime_command=agent_program.command("nul"), handlers=TABLES)
    signal_id = await emit(gateway.store, "task", {"what": "x", "who": "y"})
    signal = await finished(gateway.store, signal_id)
    [run] = await runs_of(gateway.store, signal_id)
    assert run.error == "the agent program exited with status 5; stderr ends with:\nbad\ufffdbyte \ufffd"
    assert signal.state == "failed" and run.error in signal.error
