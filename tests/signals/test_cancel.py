"""The operator cancels a Run or a pending Signal (``agent-gateway runs cancel``, ``signals cancel``).

Real ``serve`` processes and the CLI as a subprocess, on both backends: the
cancel is a write by another process, which the Signal Worker learns of
through the database's wake-ups (LISTEN/NOTIFY on PostgreSQL, the deployment's
datagram socket on SQLite) or its own periodic look.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from agent_gateway.signals import service
from agent_gateway.signals.handlers import Prompt
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import runs as run_queries
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.store.queries.signals import Signal

from tests import served
from tests.runtimes.test_persistent import Agent, gone
from tests.signals.conftest import (
    AGENT_PROGRAM,
    AgentProgram,
    GatewayFactory,
    emit,
    finished,
    runs_of,
    signal_of,
    until,
)

pytestmark = pytest.mark.processes

HANDLERS = {"task": {"template": "{{ what }}"}}
REFUSED = re.compile(r"agent-gateway: error: \S.*")


def per_run(agent_program: AgentProgram) -> dict[str, str]:
    """A per-run agent program that does what its Prompt says (``tests/agent_program.py prompt``)."""
    return {
        "AGENT_GATEWAY_RUNTIME_MODE": "per-run",
        "AGENT_GATEWAY_RUNTIME_COMMAND": json.dumps(
            [sys.executable, str(AGENT_PROGRAM), str(agent_program.record), "prompt", "{run_id}"]
        ),
        "AGENT_GATEWAY_HANDLERS": json.dumps(HANDLERS),
        **agent_program.sandbox_env(),
    }


def host_pid(record: Path, pid: int) -> int:
    """``pid``, recorded by a live program whose command line names ``record``, as this host
    sees it: a confined program knows only its own PID namespace's numbers."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            status = (entry / "status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if str(record).encode() in argv and nspid and int(nspid[-1]) == pid:
            return int(entry.name)
    raise AssertionError(f"no live program of {record} has the pid {pid}")


async def running_run_of(store: Store, signal_id: str) -> Any:
    """The Run of ``signal_id`` once it is running."""

    async def running() -> bool:
        return [run.state for run in await runs_of(store, signal_id)] == ["running"]

    await until(running)
    [run] = await runs_of(store, signal_id)
    return run


def cancelled(gateway: served.ServedGateway, record: str, id: str) -> dict[str, Any]:
    """``agent-gateway RECORD cancel ID``, which must succeed; the record it prints."""
    return gateway.cli_json(record, "cancel", id)


def refused(gateway: served.ServedGateway, record: str, id: str, *, here: bool = False) -> str:
    """``agent-gateway RECORD cancel ID``, which must be refused with one line and exit 1; that line.
    ``here``: in this process (``served.run_cli_here``), for the repeats of a table."""
    result = gateway.cli_here(record, "cancel", id) if here else gateway.cli(record, "cancel", id)
    assert result.returncode == 1, result.stdout
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert REFUSED.fullmatch(line), result.stderr
    return line


def metric(gateway: served.ServedGateway, record: str) -> float:
    """The gateway's ``agent_gateway_cancelled{record=RECORD}`` sample."""
    text = httpx.get(f"{gateway.ops_url}/metrics", timeout=120).text
    [value] = re.findall(rf'^agent_gateway_cancelled{{record="{record}"}} (\S+)$', text, re.MULTILINE)
    return float(value)


async def everything(store: Store) -> list[Any]:
    """Every Signal and Run, to show that a refusal changed nothing."""
    async with store.read() as conn:
        return [
            [signal.to_json() for signal in await service.list_signals(conn, 200)],
            [run.to_json() for run in await service.list_runs(conn, 200)],
        ]


@pytest.mark.e2e
async def test_a_hanging_per_run_program_is_cancelled_and_the_queue_moves_on(
    tmp_path: Path, database_url: str
) -> None:
    agent_program = AgentProgram(tmp_path)
    store = Store(database_url)
    try:
        # A program that ignores SIGTERM: the cancel takes SIGKILL after the grace period.
        stuck = await emit(store, "task", {"what": "stubborn"})
        dropped = await emit(store, "task", {"what": "ok"})
        later = await emit(store, "task", {"what": "ok"})
        with served.ServedGateway.start(tmp_path / "deployment", database_url, per_run(agent_program)) as gateway:
            run = await running_run_of(store, stuck)
            await agent_program.wait_started()
            # The program's pid as this host sees it (a confined one knows its own namespace's).
            stuck_pid = host_pid(agent_program.record, agent_program.calls()[0]["pid"])
            assert metric(gateway, "run") == metric(gateway, "signal") == 0

            # A pending Signal: failed without being run.
            printed = cancelled(gateway, "signals", dropped)
            assert (printed["id"], printed["state"], printed["error"]) == (dropped, "failed", "cancelled by the operator")

            # How the operator finds it (docs/operate/control.md).
            assert [listed["id"] for listed in gateway.cli_json("runs", "list", "--state", "running")] == [run.id]
            printed = cancelled(gateway, "runs", run.id)
            assert (printed["id"], printed["state"], printed["error"]) == (run.id, "failed", "cancelled by the operator")
            assert printed["endedAt"] is not None

            assert (await finished(store, later)).state == "done"
            await gone(stuck_pid)
            await until(lambda: metric(gateway, "run") == 1)  # the gauge is cached for a few seconds
            assert metric(gateway, "signal") == 1
            # Cancelling it again: it has ended; nothing changes.
            before = await everything(store)
            line = refused(gateway, "runs", run.id)
            assert line == f"agent-gateway: error: Run {run.id} has already ended (failed); nothing was changed"
            assert await everything(store) == before
        output = gateway.output()

        stuck_signal = await signal_of(store, stuck)
        [stuck_run] = await runs_of(store, stuck)
        dropped_signal = await signal_of(store, dropped)
        assert await runs_of(store, dropped) == []
    finally:
        await store.close()

    assert (stuck_run.state, stuck_run.error, stuck_run.ended_at) == ("failed", "cancelled by the operator", printed["endedAt"])
    assert stuck_signal.state == "failed"
    assert stuck_signal.error == f"Run {run.id} (session {run.session}) failed: cancelled by the operator"
    assert (dropped_signal.state, dropped_signal.error) == ("failed", "cancelled by the operator")
    # One program per Run, each once: the cancelled one never again, the dropped Signal never.
    assert [call["stdin"] for call in agent_program.calls()] == ["stubborn", "ok"]
    assert f"Run {run.id} cancelled by the operator; stopping the agent program" in output
    assert f"Signal {stuck} failed" in output


@pytest.mark.e2e
async def test_a_hanging_persistent_program_is_stopped_and_a_fresh_one_runs_the_next_signal(
    tmp_path: Path, database_url: str
) -> None:
    agent = Agent(tmp_path)
    env = {
        "AGENT_GATEWAY_RUNTIME_MODE": "persistent",
        "AGENT_GATEWAY_RUNTIME_COMMAND": json.dumps(agent.argv()),
        "AGENT_GATEWAY_HANDLERS": json.dumps(HANDLERS),
        # The folder its record goes to, writable when it runs confined.
        "AGENT_GATEWAY_RUNTIME_SANDBOX_RW": json.dumps([str(agent.record.parent)]),
    }
    store = Store(database_url)
    try:
        stuck = await emit(store, "task", {"what": "hang"})
        later = await emit(store, "task", {"what": "ok"})
        with served.ServedGateway.start(tmp_path / "deployment", database_url, env) as gateway:
            run = await running_run_of(store, stuck)
            await until(lambda: len(agent.calls()) == 1)
            stuck_pid = host_pid(agent.record, agent.calls()[0]["pid"])
            cancelled(gateway, "runs", run.id)
            assert (await finished(store, later)).state == "done"
            await gone(stuck_pid)
            await until(lambda: len(agent.calls()) == 2)
            fresh_pid = host_pid(agent.record, agent.calls()[1]["pid"])
            await until(lambda: metric(gateway, "run") == 1)
        stuck_signal = await signal_of(store, stuck)
        [stuck_run] = await runs_of(store, stuck)
        [later_run] = await runs_of(store, later)
    finally:
        await store.close()
    assert (stuck_run.state, stuck_run.error) == ("failed", "cancelled by the operator")
    assert stuck_signal.state == "failed" and "cancelled by the operator" in (stuck_signal.error or "")
    # The cancelled Run was handed out once; the next went to a program started afresh.
    assert [call["run"]["id"] for call in agent.calls()] == [run.id, later_run.id]
    assert fresh_pid != stuck_pid


@pytest.mark.e2e
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_cancel_from_another_host_reaches_the_worker_process(tmp_path: Path, database_url: str) -> None:
    """The CLI shares nothing with a ``serve --role worker`` process but the PostgreSQL database."""
    agent_program = AgentProgram(tmp_path)
    directory = tmp_path / "deployment"
    init = served.run_cli("init", str(directory), config=directory / "gateway.toml")
    assert init.returncode == 0, init.stderr
    env = {"AGENT_GATEWAY_DATABASE_URL": database_url, **per_run(agent_program)}
    store = Store(database_url)
    log = directory / "worker.log"
    try:
        stuck = await emit(store, "task", {"what": "hang"})
        later = await emit(store, "task", {"what": "ok"})
        with open(log, "wb") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "agent_gateway", "serve", "--role", "worker"],
                env=served.cli_env(directory / "gateway.toml", env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            run = await running_run_of(store, stuck)
            # The operator's machine: another config file, the same database.
            elsewhere = tmp_path / "operator"
            assert served.run_cli("init", str(elsewhere), config=elsewhere / "gateway.toml").returncode == 0
            result = served.run_cli(
                "runs", "cancel", run.id, config=elsewhere / "gateway.toml",
                env={"AGENT_GATEWAY_DATABASE_URL": database_url},
            )
            assert result.returncode == 0, result.stderr
            assert orjson.loads(result.stdout)["state"] == "failed"
            assert (await finished(store, later)).state == "done", log.read_text()
        finally:
            assert served.stop_process(worker) == 0
        stuck_signal = await signal_of(store, stuck)
    finally:
        await store.close()
    assert stuck_signal.state == "failed"
    assert [call["stdin"] for call in agent_program.calls()] == ["hang", "ok"]
    assert f"Run {run.id} cancelled by the operator" in log.read_text()


@pytest.mark.e2e
async def test_every_refusal_is_one_line_and_changes_nothing(tmp_path: Path, database_url: str) -> None:
    agent_program = AgentProgram(tmp_path)
    store = Store(database_url)
    try:
        done = await emit(store, "task", {"what": "ok"})
        busy = await emit(store, "task", {"what": "hang"})
        with served.ServedGateway.start(tmp_path / "deployment", database_url, per_run(agent_program)) as gateway:
            assert (await finished(store, done)).state == "done"
            [done_run] = await runs_of(store, done)
            await running_run_of(store, busy)
            before = await everything(store)
            nobody = str(uuid.uuid4())
            # Each command's refusal once in a process of its own, the rest of the table in this one.
            lines = [
                refused(gateway, "runs", done_run.id),
                refused(gateway, "signals", done),
                refused(gateway, "signals", busy, here=True),
                refused(gateway, "runs", nobody, here=True),
                refused(gateway, "signals", nobody, here=True),
                refused(gateway, "runs", "not-a-uuid", here=True),
                refused(gateway, "signals", "42", here=True),
            ]
            assert await everything(store) == before
            assert metric(gateway, "run") == metric(gateway, "signal") == 0
            agent_program.release()
            assert (await finished(store, busy)).state == "done"
    finally:
        await store.close()
    error = "agent-gateway: error: "
    assert lines[:5] == [
        f"{error}Run {done_run.id} has already ended (done); nothing was changed",
        f"{error}Signal {done} has already ended (done); nothing was changed",
        f"{error}Signal {busy} is processing, not pending: cancel its running Run instead "
        f"(agent-gateway runs list --signal {busy} --state running; agent-gateway runs cancel RUN_ID)",
        f"{error}no Run has the id {nobody}",
        f"{error}no Signal has the id {nobody}",
    ]
    assert lines[5:] == [f"{error}id must be a UUID"] * 2  # as `runs show` says


class TwoPrompts:
    """A Python Handler whose Signal has two Runs: the Prompts are the payload's ``first`` and ``then``."""

    def handle(self, signal: Signal) -> list[Prompt]:
        return [Prompt(signal.payload["first"]), Prompt(signal.payload["then"])]


async def test_cancelling_a_running_run_fails_the_runs_of_its_signal_not_started_yet(
    make_gateway: GatewayFactory, agent_program: AgentProgram, database_url: str
) -> None:
    gateway = await make_gateway(
        register={"pair": TwoPrompts()}, runtime_mode="per-run", runtime_command=agent_program.command("prompt")
    )
    signal_id = await emit(gateway.store, "pair", {"first": "hang", "then": "ok"})
    later = await emit(gateway.store, "pair", {"first": "ok", "then": "ok"})
    await agent_program.wait_started()
    first, second = await runs_of(gateway.store, signal_id)
    # Another process's Store: its wake-up crosses processes as the CLI's does.
    operator = Store(database_url)
    try:
        async with operator.transaction() as conn:
            await service.cancel_run(conn, first.id)
    finally:
        await operator.close()
    assert (await finished(gateway.store, later)).state == "done"
    ended = await signal_of(gateway.store, signal_id)
    first, second = await runs_of(gateway.store, signal_id)
    assert (first.state, first.error) == ("failed", service.CANCELLED_ERROR)
    assert (second.state, second.error, second.started_at) == ("failed", service.CANCELLED_SIBLING_ERROR, None)
    assert ended.state == "failed"
    assert ended.error == f"Run {first.id} (session {first.session}) failed: cancelled by the operator"
    assert [call["stdin"] for call in agent_program.calls()] == ["hang", "ok", "ok"]


async def test_a_run_cancelled_before_it_started_is_never_started(
    make_gateway: GatewayFactory, agent_program: AgentProgram, database_url: str
) -> None:
    gateway = await make_gateway(
        register={"pair": TwoPrompts()}, runtime_mode="per-run", runtime_command=agent_program.command("prompt")
    )
    signal_id = await emit(gateway.store, "pair", {"first": "hang", "then": "ok"})
    await agent_program.wait_started()
    first, second = await runs_of(gateway.store, signal_id)
    async with gateway.store.transaction() as conn:
        await service.cancel_run(conn, second.id)
    agent_program.release()  # the first Run ends on its own
    ended = await finished(gateway.store, signal_id)
    first, second = await runs_of(gateway.store, signal_id)
    assert (first.state, second.state, second.error, second.started_at) == (
        "done", "failed", service.CANCELLED_ERROR, None
    )
    assert ended.state == "failed"
    assert ended.error == f"Run {second.id} (session {second.session}) failed: cancelled by the operator"
    assert [call["stdin"] for call in agent_program.calls()] == ["hang"]


class CancelledAsItEnds:
    """A runtime whose Runs with the Prompt ``cancel me`` are cancelled (by another Store, as the
    CLI would) just as the program ends on its own, before the Signal Worker records the end."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.prompts: list[str] = []

    async def run(self, run: Any) -> None:
        self.prompts.append(run.prompt)
        if run.prompt == "cancel me":
            operator = Store(self.database_url)
            try:
                async with operator.transaction() as conn:
                    await service.cancel_run(conn, run.id)
            finally:
                await operator.close()


@pytest.mark.parametrize("handler", ["template", "two Runs"])
async def test_a_cancel_that_lands_as_the_run_ends_stands_and_fails_its_signal(
    make_gateway: GatewayFactory, database_url: str, handler: str
) -> None:
    """Whichever comes first, the worker's look or its record of the end, the cancel stands."""
    runtime = CancelledAsItEnds(database_url)
    if handler == "template":  # one Run, ended with its Signal and the next claim in one statement on PostgreSQL
        gateway = await make_gateway(runtime=runtime, handlers={"task": {"template": "{{ first }}"}})
    else:
        gateway = await make_gateway(runtime=runtime, register={"task": TwoPrompts()})
    signal_id = await emit(gateway.store, "task", {"first": "cancel me", "then": "ok"})
    later = await emit(gateway.store, "task", {"first": "ok", "then": "ok"})
    assert (await finished(gateway.store, later)).state == "done"
    ended = await signal_of(gateway.store, signal_id)
    first, *rest = await runs_of(gateway.store, signal_id)
    assert (first.state, first.error) == ("failed", service.CANCELLED_ERROR)
    assert [(run.state, run.error, run.started_at) for run in rest] == [
        ("failed", service.CANCELLED_SIBLING_ERROR, None)
    ] * len(rest)
    assert ended.state == "failed"
    # With the Runs after it listed, when the worker learns of the cancel as it records the end.
    assert f"Run {first.id} (session {first.session}) failed: cancelled by the operator" in ended.error
    assert runtime.prompts[0] == "cancel me" and "cancel me" not in runtime.prompts[1:]


async def test_ending_a_cancelled_run_leaves_it_cancelled_and_fails_its_signal(store: Store) -> None:
    """The worker's one-statement end (``signals.end_and_claim``) against a Run cancelled meanwhile."""
    signal_id = await emit(store, "task", {})
    next_id = await emit(store, "task", {})
    async with store.transaction() as conn:
        assert (await signal_queries.claim_oldest(conn)).id == signal_id
        [run] = await run_queries.record(
            conn, signal_id=signal_id, prompts=[(str(uuid.uuid4()), "s", "p")], first_started_at="2026-11-25T10:00:00.000Z"
        )
    async with store.transaction() as conn:
        cancelled_run = await service.cancel_run(conn, run.id)
    async with store.transaction() as conn:
        claimed = await signal_queries.end_and_claim(
            conn, run_id=run.id, run_error=None, ended_at="2026-11-25T10:00:01.000Z", signal_id=signal_id,
            signal_error=None, signal_error_if_cancelled="the Run was cancelled",
        )
    assert claimed is not None and claimed.id == next_id
    async with store.read() as conn:
        assert await run_queries.get(conn, id=run.id) == cancelled_run
    ended = await signal_of(store, signal_id)
    assert (ended.state, ended.error) == ("failed", "the Run was cancelled")
