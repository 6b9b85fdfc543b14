"""The Signal Worker with the persistent runtime and a real long-lived agent, on both backends."""

from __future__ import annotations

import logging
import os
import signal

import pytest


from tests.conftest import terminate_lock_sessions
from tests.runtimes.test_persistent import Agent, alive, gone
from tests.signals.conftest import GatewayFactory, emit, finished, runs_of, until

pytestmark = pytest.mark.processes

TABLES = {"task": {"template": "{{ what }}"}}
postgresql_only = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


@pytest.fixture
def agent(tmp_path) -> Agent:  # type: ignore[no-untyped-def]
    return Agent(tmp_path)


async def persistent(make_gateway: GatewayFactory, agent: Agent):  # type: ignore[no-untyped-def]
    return await make_gateway(runtime_command=agent.argv(), runtime_mode="persistent", handlers=TABLES)


async def test_one_program_runs_every_signal_and_a_failed_answer_fails_only_its_run(
    make_gateway: GatewayFactory, agent: Agent
) -> None:
    gateway = await persistent(make_gateway, agent)
    ids = [await emit(gateway.store, "task", {"what": what}) for what in ("ok", "fail", "ok")]
    done, failed, later = [await finished(gateway.store, signal_id) for signal_id in ids]
    assert (done.state, done.error, later.state) == ("done", None, "done")
    [run] = await runs_of(gateway.store, ids[1])
    assert (run.state, run.error) == ("failed", "no luck\nsecond line")
    assert failed.state == "failed" and "no luck" in (failed.error or "")
    assert len(set(agent.pids())) == 1
    assert [call["run"]["signalId"] for call in agent.calls()] == ids


async def test_an_agent_killed_mid_run_fails_that_run_once_and_the_next_signal_is_answered(
    make_gateway: GatewayFactory, agent: Agent
) -> None:
    gateway = await persistent(make_gateway, agent)
    stuck = await emit(gateway.store, "task", {"what": "hang"})
    await until(lambda: len(agent.calls()) == 1)
    [stuck_run] = await runs_of(gateway.store, stuck)
    assert stuck_run.state == "running"  # what an operator sees in GET /runs
    os.kill(agent.pids()[0], signal.SIGKILL)  # what an operator does
    signal_ = await finished(gateway.store, stuck)
    [run] = await runs_of(gateway.store, stuck)
    assert (signal_.state, run.state) == ("failed", "failed")
    assert run.error == "the agent program was killed by signal SIGKILL (9); stderr was empty"
    after = await finished(gateway.store, await emit(gateway.store, "task", {"what": "ok"}))
    assert after.state == "done"
    assert [call["run"]["signalId"] for call in agent.calls()] == [stuck, after.id]  # never re-run


async def test_stopping_the_gateway_stops_the_agent(make_gateway: GatewayFactory, agent: Agent) -> None:
    gateway = await persistent(make_gateway, agent)
    await finished(gateway.store, await emit(gateway.store, "task", {"what": "spawn"}))
    [pid] = agent.pids()
    child = agent.child()
    await gateway.stop()
    assert not alive(pid)
    await gone(child)


async def test_stopping_the_gateway_mid_run_fails_the_run_and_stops_the_agent(
    make_gateway: GatewayFactory, agent: Agent
) -> None:
    gateway = await persistent(make_gateway, agent)
    stuck = await emit(gateway.store, "task", {"what": "hang"})
    await until(lambda: len(agent.calls()) == 1)
    [pid] = agent.pids()  # while it lives: a confined program's pid is known to the host only then
    await gateway.stop_worker()
    assert not alive(pid)
    [run] = await runs_of(gateway.store, stuck)
    assert run.state == "failed"


@postgresql_only
async def test_losing_leadership_stops_the_agent_and_leading_again_starts_one(
    make_gateway: GatewayFactory, agent: Agent, database_url: str
) -> None:
    gateway = await persistent(make_gateway, agent)
    await finished(gateway.store, await emit(gateway.store, "task", {"what": "ok"}))
    [first] = agent.pids()
    await terminate_lock_sessions(database_url)  # as a failover would
    await gone(first)
    # This process leads again after its retry: the next Signal gets a fresh agent.
    await finished(gateway.store, await emit(gateway.store, "task", {"what": "ok"}))
    assert agent.pid(1) != first  # the first program's pid is no longer known here: it has exited


@postgresql_only
async def test_losing_leadership_kills_the_agent_at_once_before_its_run_is_cancelled(
    make_gateway: GatewayFactory, agent: Agent, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A leader that finds its lock lost SIGKILLs its agent (and what it started) mid-Run, rather than
    SIGTERM and a grace period longer than a new leader's wait; the Run is failed by recovery."""
    gateway = await persistent(make_gateway, agent)
    await finished(gateway.store, await emit(gateway.store, "task", {"what": "spawn-stubborn"}))
    [pid] = agent.pids()
    child = agent.child()
    stuck = await emit(gateway.store, "task", {"what": "hang"})
    await until(lambda: len(agent.calls()) == 2)
    with caplog.at_level(logging.WARNING, logger="agent_gateway.signals.worker"):
        await terminate_lock_sessions(database_url)  # as a failover would
        await until(lambda: any(getattr(r, "action", None) == "agent_killed" for r in caplog.records))
    await gone(pid)
    await gone(child)
    signal_ = await finished(gateway.store, stuck)  # recovered once this process leads again
    [run] = await runs_of(gateway.store, stuck)
    assert (signal_.state, run.state) == ("failed", "failed")
    assert [call["run"]["signalId"] for call in agent.calls()][1:] == [stuck]  # never re-run
