"""Crash recovery with a real ``agent-gateway serve`` killed with SIGKILL while a Run is running."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import httpx
import pytest

from agent_gateway.signals import service
from agent_gateway.store.engine import Store

from tests import served
from tests.signals.conftest import AGENT_PROGRAM, AgentProgram, emit, runs_of, signal_of, until

pytestmark = pytest.mark.e2e

HANDLERS = {"task": {"template": "do {{ what }}", "session": "{{ who }}"}}


async def test_a_killed_gateway_fails_the_running_signal_and_runs_the_pending_one_after_restart(
    tmp_path: Path, database_url: str
) -> None:
    agent_program = AgentProgram(tmp_path)
    env = {
        "AGENT_GATEWAY_RUNTIME_MODE": "per-run",  # the agent program reads one Prompt and exits
        "AGENT_GATEWAY_RUNTIME_COMMAND": json.dumps(
            [sys.executable, str(AGENT_PROGRAM), str(agent_program.record), "hang", "{run_id}"]
        ),
        "AGENT_GATEWAY_HANDLERS": json.dumps(HANDLERS),
        **agent_program.sandbox_env(),
    }
    store = Store(database_url)
    try:
        # Queued before the gateway starts: its worker drains them at start, oldest first.
        interrupted = await emit(store, "task", {"what": "the long thing", "who": "alpha"})
        waiting = await emit(store, "task", {"what": "the next thing", "who": "beta"})

        with served.ServedGateway.start(tmp_path / "deployment", database_url, env) as first:
            await agent_program.wait_started()
            assert first.stop(signal.SIGKILL) == -signal.SIGKILL
            # What the killed process left behind: mid-Run.
            assert (await signal_of(store, interrupted)).state == "processing"
            [run] = await runs_of(store, interrupted)
            assert run.state == "running"
            assert (await signal_of(store, waiting)).state == "pending"
            # The orphaned agent program finishes on its own; its outcome is never recorded.
            agent_program.release()

            second = served.ServedGateway.spawn(first.directory, first.env)
            try:
                async with httpx.AsyncClient(base_url=second.agent_url) as agent:

                    async def ended(signal_id: str) -> bool:
                        body = (await agent.get(f"/signals/{signal_id}")).json()
                        return body["state"] in ("done", "failed")

                    await until(lambda: ended(waiting))
                    failed = (await agent.get(f"/signals/{interrupted}")).json()
                    done = (await agent.get(f"/signals/{waiting}")).json()
                    [failed_run] = (await agent.get("/runs", params={"signalId": interrupted})).json()["runs"]
                    [done_run] = (await agent.get("/runs", params={"signalId": waiting})).json()["runs"]
            finally:
                second.stop()
            output = second.output() + first.output()
    finally:
        await store.close()

    assert (failed["state"], failed["error"]) == ("failed", service.STOPPED_SIGNAL_ERROR)
    assert (failed_run["id"], failed_run["state"], failed_run["error"]) == (run.id, "failed", service.STOPPED_RUN_ERROR)
    assert failed_run["startedAt"] == run.started_at and failed_run["endedAt"] is not None
    assert (done["state"], done["error"]) == ("done", None)
    assert (done_run["state"], done_run["session"], done_run["prompt"]) == ("done", "beta", "do the next thing")
    # Nothing ran twice: one agent program per Run, the interrupted one never again.
    assert [call["argv"] for call in agent_program.calls()] == [[run.id], [done_run["id"]]]
    assert f"Signal {interrupted} failed: left processing by a stopped process, not re-run" in output
    # Never a Prompt or a payload in the log.
    assert "the long thing" not in output and "the next thing" not in output


async def test_stopping_a_served_gateway_mid_run_stops_the_agent_and_records_why(
    tmp_path: Path, database_url: str
) -> None:
    agent_program = AgentProgram(tmp_path)
    env = {
        "AGENT_GATEWAY_RUNTIME_MODE": "per-run",
        "AGENT_GATEWAY_RUNTIME_COMMAND": json.dumps([sys.executable, str(AGENT_PROGRAM), str(agent_program.record), "hang"]),
        "AGENT_GATEWAY_HANDLERS": json.dumps(HANDLERS),
        **agent_program.sandbox_env(),
    }
    store = Store(database_url)
    try:
        signal_id = await emit(store, "task", {"what": "x", "who": "y"})
        with served.ServedGateway.start(tmp_path / "deployment", database_url, env) as gateway:
            await agent_program.wait_started()
            assert gateway.stop(signal.SIGTERM) == 0
        stopped = await signal_of(store, signal_id)
        [run] = await runs_of(store, signal_id)
    finally:
        await store.close()
    assert (stopped.state, run.state, run.error) == ("failed", "failed", service.STOPPED_RUN_ERROR)
