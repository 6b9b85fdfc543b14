"""The Signal Worker end to end, in process, on both backends (spec: Signal, Run, States and transitions)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from agent_gateway import clock
from agent_gateway.signals import service
from agent_gateway.signals.handlers import Prompt, TemplateHandler
from agent_gateway.store.queries.signals import Signal

from tests.signals.conftest import (
    AgentProgram,
    GatewayFactory,
    Recording,
    emit,
    finished,
    runs_of,
    signal_of,
    until,
)

# Each test runs agent programs: a processes test (scripts/test --fast leaves it out).
pytestmark = pytest.mark.processes

MESSAGE = {"id": "m-1", "userId": "0b7c5e4e-52c3-4a83-a7a4-0ad3c1b8f7a2", "direction": "inbound", "seq": 1,
           "text": "hello", "createdAt": "2026-11-21T23:03:30.123Z"}


class Fanout:
    """A Python Handler: one Prompt per Session named in the payload, then a post phase."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, bool]] = []

    def handle(self, signal: Signal) -> list[Prompt]:
        return [Prompt(f"prompt for {name}", name) for name in signal.payload["sessions"]]

    async def post(self, signal: Signal, failed: bool) -> None:
        self.posts.append((signal.id, failed))


async def test_a_signal_becomes_one_run_per_prompt_and_ends_done(make_gateway: GatewayFactory) -> None:
    runtime, handler = Recording(), Fanout()
    gateway = await make_gateway(runtime, register={"fanout": handler})
    signal_id = await emit(gateway.store, "fanout", {"sessions": ["alpha", "beta", "gamma"]})

    signal = await finished(gateway.store, signal_id)
    assert (signal.state, signal.error) == ("done", None)
    runs = await runs_of(gateway.store, signal_id)
    assert [(run.session, run.prompt, run.state, run.error) for run in runs] == [
        ("alpha", "prompt for alpha", "done", None),
        ("beta", "prompt for beta", "done", None),
        ("gamma", "prompt for gamma", "done", None),
    ]
    # Executed one at a time, in the Handler's order.
    assert [run.session for run in runtime.runs] == ["alpha", "beta", "gamma"]
    for run in runs:
        assert run.signal_id == signal_id
        assert uuid.UUID(run.id).version == 7  # ids.new: written at the end of every index on them
        assert run.started_at is not None and run.ended_at is not None
        assert run.started_at <= run.ended_at
    assert runs[0].ended_at <= runs[1].started_at <= runs[1].ended_at <= runs[2].started_at
    assert handler.posts == [(signal_id, False)]


async def test_a_failed_run_does_not_stop_later_runs_and_fails_the_signal(make_gateway: GatewayFactory) -> None:
    runtime, handler = Recording(fail={"prompt for beta": "the agent gave up"}), Fanout()
    gateway = await make_gateway(runtime, register={"fanout": handler})
    signal_id = await emit(gateway.store, "fanout", {"sessions": ["alpha", "beta", "gamma"]})

    signal = await finished(gateway.store, signal_id)
    runs = await runs_of(gateway.store, signal_id)
    assert [(run.session, run.state) for run in runs] == [("alpha", "done"), ("beta", "failed"), ("gamma", "done")]
    assert runs[1].error == "the agent gave up"
    assert signal.state == "failed"
    assert signal.error == f"Run {runs[1].id} (session beta) failed: the agent gave up"
    assert handler.posts == [(signal_id, True)]


async def test_several_failed_runs_are_all_named(make_gateway: GatewayFactory) -> None:
    runtime = Recording(fail={"prompt for a": "first reason", "prompt for b": "second reason"})
    gateway = await make_gateway(runtime, register={"fanout": Fanout()})
    signal_id = await emit(gateway.store, "fanout", {"sessions": ["a", "b", "c"]})

    signal = await finished(gateway.store, signal_id)
    runs = await runs_of(gateway.store, signal_id)
    assert signal.error == (
        f"2 of 3 Runs failed: Run {runs[0].id} (session a) failed: first reason; "
        f"Run {runs[1].id} (session b) failed: second reason"
    )


async def test_a_runtime_that_raises_fails_the_run_with_the_exception_named(make_gateway: GatewayFactory) -> None:
    class Broken:
        async def run(self, run: object) -> None:
            raise KeyError("missing")

    gateway = await make_gateway(Broken(), register={"k": TemplateHandler("k", "hi")})
    signal_id = await emit(gateway.store, "k", {})
    signal = await finished(gateway.store, signal_id)
    [run] = await runs_of(gateway.store, signal_id)
    assert (run.state, run.error) == ("failed", "the runtime failed: KeyError: 'missing'")
    assert signal.state == "failed"


async def test_a_runtime_whose_start_raises_never_stops_the_worker(make_gateway: GatewayFactory) -> None:
    class Unstartable(Recording):
        async def start(self) -> None:  # what the worker calls as it starts leading
            raise KeyError("a bug in starting the agent")

    runtime = Unstartable()
    gateway = await make_gateway(runtime, register={"k": TemplateHandler("k", "hi")})
    signal = await finished(gateway.store, await emit(gateway.store, "k", {}))
    assert signal.state == "done" and len(runtime.runs) == 1


async def test_a_fresh_session_is_named_after_the_run(make_gateway: GatewayFactory) -> None:
    class Fresh:
        def handle(self, signal: Signal) -> list[Prompt]:
            return [Prompt("one"), Prompt("two")]

    gateway = await make_gateway(Recording(), register={"fresh": Fresh()})
    signal_id = await emit(gateway.store, "fresh", None)
    await finished(gateway.store, signal_id)
    runs = await runs_of(gateway.store, signal_id)
    assert [run.session for run in runs] == [f"run_{run.id}" for run in runs]
    assert runs[0].session != runs[1].session


async def test_a_handler_returning_no_prompts_ends_done_without_runs(make_gateway: GatewayFactory) -> None:
    class Nothing:
        async def handle(self, signal: Signal) -> list[Prompt]:
            return []

    gateway = await make_gateway(Recording(), register={"quiet": Nothing()})
    signal_id = await emit(gateway.store, "quiet", [1, 2])
    signal = await finished(gateway.store, signal_id)
    assert (signal.state, signal.error) == ("done", None)
    assert await runs_of(gateway.store, signal_id) == []


async def test_a_signal_with_no_handler_fails_every_time(make_gateway: GatewayFactory) -> None:
    runtime = Recording()
    gateway = await make_gateway(runtime)
    first = await emit(gateway.store, "service_schedule_fired", {"scheduleName": "x"})
    second = await emit(gateway.store, "service_schedule_fired", {"scheduleName": "x"})
    for signal_id in (first, second):
        signal = await finished(gateway.store, signal_id)
        assert signal.state == "failed"
        assert signal.error == "no Signal Handler is registered for kind 'service_schedule_fired'"
        assert await runs_of(gateway.store, signal_id) == []
    assert runtime.runs == []


async def test_a_handler_that_raises_fails_the_signal_and_records_no_run(make_gateway: GatewayFactory) -> None:
    class Raising:
        def handle(self, signal: Signal) -> list[Prompt]:
            raise RuntimeError("cannot handle this")

    gateway = await make_gateway(Recording(), register={"bad": Raising()})
    signal_id = await emit(gateway.store, "bad", {})
    signal = await finished(gateway.store, signal_id)
    assert signal.state == "failed"
    assert signal.error == "the Signal Handler for kind 'bad' failed: RuntimeError: cannot handle this"
    assert await runs_of(gateway.store, signal_id) == []


@pytest.mark.parametrize(
    ("returned", "reason"),
    [
        ("a string", "TypeError: handle() must return a list of Prompts, not str"),
        (None, "TypeError: handle() must return a list of Prompts, not NoneType"),
        (["text"], "TypeError: handle() returned a str, not a Prompt"),
        ([Prompt(3)], "TypeError: a Prompt's text must be a string, not int"),  # type: ignore[arg-type]
        ([Prompt("x", "")], "TypeError: a Prompt's session must be a non-empty string, or None for a fresh Session"),
        ([Prompt("nul\x00")], "ValueError: a Prompt or Session contains a NUL character or a lone surrogate"),
        ([Prompt("x", "\ud800")], "ValueError: a Prompt or Session contains a NUL character or a lone surrogate"),
    ],
)
async def test_a_handler_returning_something_unstorable_fails_the_signal(
    make_gateway: GatewayFactory, returned: object, reason: str
) -> None:
    class Wrong:
        def handle(self, signal: Signal) -> object:
            return returned

    gateway = await make_gateway(Recording(), register={"wrong": Wrong()})
    signal_id = await emit(gateway.store, "wrong", {})
    signal = await finished(gateway.store, signal_id)
    assert (signal.state, signal.error) == ("failed", f"the Signal Handler for kind 'wrong' failed: {reason}")
    assert await runs_of(gateway.store, signal_id) == []


async def test_a_post_phase_that_raises_fails_the_signal_after_its_runs(make_gateway: GatewayFactory) -> None:
    class PostRaises(Fanout):
        def post(self, signal: Signal, failed: bool) -> None:  # type: ignore[override]
            raise ValueError(f"post saw failed={failed}")

    gateway = await make_gateway(Recording(), register={"k": PostRaises()})
    signal_id = await emit(gateway.store, "k", {"sessions": ["s"]})
    signal = await finished(gateway.store, signal_id)
    assert [run.state for run in await runs_of(gateway.store, signal_id)] == ["done"]
    assert signal.state == "failed"
    assert signal.error == "the post phase of the Signal Handler for kind 'k' failed: ValueError: post saw failed=False"


async def test_a_template_that_does_not_render_fails_the_signal_naming_the_kind(make_gateway: GatewayFactory) -> None:
    tables = {"message.received": {"template": "From {{ userId }}: {{ text }}", "session": "user_{{ userId }}"}}
    gateway = await make_gateway(Recording(), handlers=tables)
    bad = await emit(gateway.store, "message.received", {"userId": "u"})
    good = await emit(gateway.store, "message.received", {"userId": "u", "text": "hi"})

    signal = await finished(gateway.store, bad)
    assert signal.state == "failed"
    assert signal.error == (
        "the Signal Handler for kind 'message.received' failed: "
        "the template of [handlers.\"message.received\"] did not render: 'text' is undefined"
    )
    assert await runs_of(gateway.store, bad) == []
    assert (await finished(gateway.store, good)).state == "done"
    [run] = await runs_of(gateway.store, good)
    assert (run.prompt, run.session) == ("From u: hi", "user_u")


async def test_signals_are_claimed_oldest_first_and_runs_are_serial(make_gateway: GatewayFactory) -> None:
    active, most = 0, 0
    order: list[str] = []

    class Slow:
        async def run(self, run: object) -> None:
            nonlocal active, most
            active += 1
            most = max(most, active)
            order.append(run.prompt)  # type: ignore[attr-defined]
            await asyncio.sleep(0.001)
            active -= 1

    frozen = clock.FrozenClock("2026-11-21T10:00:00Z")
    gateway = await make_gateway(Slow(), register={"k": TemplateHandler("k", "{{ n }}")})
    with clock.use(frozen):
        # Same emittedAt for all: ties are broken by emission order. One transaction, so the
        # worker sees them all at once and must pick by queue order.
        async with gateway.store.transaction() as conn:
            ids = [await service.emit(conn, "k", {"n": str(n)}) for n in range(8)]
        for signal_id in ids:
            await finished(gateway.store, signal_id)
    assert order == [str(n) for n in range(8)]
    assert most == 1


async def test_the_worker_is_woken_by_an_emit_not_by_the_sweep(make_gateway: GatewayFactory, monkeypatch) -> None:
    from agent_gateway.signals import worker

    # With a sweep of an hour, only the wake-up after commit can get this Signal run.
    monkeypatch.setattr(worker, "SWEEP_INTERVAL_S", 3600)
    runtime = Recording()
    gateway = await make_gateway(runtime, register={"k": TemplateHandler("k", "x")})
    # Once a first Signal has ended, the worker has drained and waits on the channel.
    assert (await finished(gateway.store, await emit(gateway.store, "k", {}))).state == "done"
    second = await emit(gateway.store, "k", {})
    assert (await finished(gateway.store, second)).state == "done"


async def test_emit_in_a_rolled_back_transaction_leaves_nothing(make_gateway: GatewayFactory) -> None:
    runtime = Recording()
    gateway = await make_gateway(runtime, register={"k": TemplateHandler("k", "x")})

    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        async with gateway.store.transaction() as conn:
            signal_id = await service.emit(conn, "k", {"a": 1})
            raise Abort()
    async with gateway.store.read() as conn:
        assert await service.list_signals(conn, 200) == []
        with pytest.raises(service.SignalNotFound):
            await service.get_signal(conn, signal_id)
    # A later Signal runs, and it is the only one that ever did.
    later = await emit(gateway.store, "k", {})
    await finished(gateway.store, later)
    assert [run.signal_id for run in runtime.runs] == [later]


async def test_stopping_during_a_run_fails_that_run_and_its_signal(
    make_gateway: GatewayFactory, agent_program: AgentProgram
) -> None:
    gateway = await make_gateway(register={"k": Fanout()}, runtime_command=agent_program.command("hang"))
    signal_id = await emit(gateway.store, "k", {"sessions": ["first", "second"]})
    await agent_program.wait_started()
    await gateway.stop_worker()

    signal = await signal_of(gateway.store, signal_id)
    runs = await runs_of(gateway.store, signal_id)
    assert [(run.session, run.state) for run in runs] == [("first", "failed"), ("second", "failed")]
    assert runs[0].error == service.STOPPED_RUN_ERROR
    assert runs[0].started_at is not None
    assert runs[1].error == service.NOT_STARTED_RUN_ERROR
    assert runs[1].started_at is None
    assert signal.state == "failed"
    assert signal.error.startswith("the gateway stopped while this Signal was processing; ")
    assert len(agent_program.calls()) == 1


async def test_logs_name_ids_kinds_sessions_and_states_never_prompts_or_payloads(
    make_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_gateway.signals.worker")
    runtime = Recording(fail={"SECRET-PROMPT": "SECRET-ERROR"})
    gateway = await make_gateway(runtime, register={"k": TemplateHandler("k", "SECRET-PROMPT", "session-{{ who }}")})
    signal_id = await emit(gateway.store, "k", {"who": "w", "secret": "SECRET-PAYLOAD"})
    await finished(gateway.store, signal_id)
    [run] = await runs_of(gateway.store, signal_id)
    lines = [record.getMessage() for record in caplog.records if record.name == "agent_gateway.signals.worker"]
    assert lines == [
        f"Signal {signal_id} claimed (kind k)",
        f"Run {run.id} started (Signal {signal_id}, session session-w)",
        f"Run {run.id} failed (Signal {signal_id}, session session-w)",
        f"Signal {signal_id} failed (kind k)",
    ]
    assert "SECRET" not in caplog.text


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_two_processes_run_one_worker_between_them(make_gateway: GatewayFactory) -> None:
    """Runs are serial across the deployment: a second process is a standby, never a second worker."""
    active, most = 0, 0
    seen: list[str] = []

    class Counting:
        async def run(self, run: object) -> None:
            nonlocal active, most
            active += 1
            most = max(most, active)
            seen.append(run.signal_id)  # type: ignore[attr-defined]
            await asyncio.sleep(0.002)
            active -= 1

    handler = TemplateHandler("k", "x")
    first = await make_gateway(Counting(), register={"k": handler})
    second = await make_gateway(Counting(), register={"k": handler})
    ids = [await emit(first.store, "k", {"n": n}) for n in range(20)]
    for signal_id in ids:
        assert (await finished(first.store, signal_id)).state == "done"
    assert most == 1
    assert sorted(seen) == sorted(ids)  # each Signal ran once
    # Stopping the standby (or the leader) returns: neither waits for leadership it does not hold.
    await second.stop()
    await first.stop()


async def test_a_worker_failure_mid_signal_still_ends_the_signal_and_its_runs(
    make_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: recording a Run's end raises once; the Signal and the Run still end, saying why.

    A Run's end is recorded by ``runs.finish`` or, with its Signal's end and the next
    claim, by ``signals.end_and_claim``; on PostgreSQL, alone, by ``signals.end`` or, with the
    claim of the Signal read ahead, by ``ledger.claim_ahead``: whichever is called first raises.
    """
    from agent_gateway.store.queries import ledger as ledger_queries
    from agent_gateway.store.queries import runs as run_queries
    from agent_gateway.store.queries import signals as signal_queries

    failed = False

    def failing_once(function: Any, ends: Callable[..., bool] = lambda *args: True) -> Any:
        async def wrapper(*args: object, **kwargs: object) -> Any:
            nonlocal failed
            if not failed and ends(*args):
                failed = True
                raise RuntimeError("injected")
            return await function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(run_queries, "finish", failing_once(run_queries.finish))
    monkeypatch.setattr(signal_queries, "end_and_claim", failing_once(signal_queries.end_and_claim))
    monkeypatch.setattr(signal_queries, "end", failing_once(signal_queries.end))
    # claim_ahead(conn, queued, entry, record, ending): only a claim that ends a Run too.
    monkeypatch.setattr(
        ledger_queries, "claim_ahead", failing_once(ledger_queries.claim_ahead, lambda *args: args[4] is not None)
    )
    gateway = await make_gateway(Recording(), register={"k": TemplateHandler("k", "x")})
    broken = await emit(gateway.store, "k", {})
    fine = await emit(gateway.store, "k", {})

    signal = await finished(gateway.store, broken)
    expected = "the Signal Worker failed while processing this Signal: RuntimeError: injected"
    assert (signal.state, signal.error) == ("failed", expected)
    [run] = await runs_of(gateway.store, broken)
    assert (run.state, run.error) == ("failed", expected)
    assert run.ended_at is not None
    assert (await finished(gateway.store, fine)).state == "done"


class PlainPython:
    """A Python Handler (not inline): the worker asks it outside any transaction."""

    def handle(self, signal: Signal) -> list[Prompt]:
        return [Prompt(f"python {signal.payload['n']}", "python")]


@pytest.mark.parametrize(("kind", "inline"), [("template", True), ("python", False)])
async def test_an_inline_handler_s_signal_is_claimed_its_run_recorded_and_started_in_one_commit(
    make_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch, kind: str, inline: bool
) -> None:
    """The worker's commits per single-Run Signal: one with a [handlers] template, two with Python."""
    runtime = Recording()
    gateway = await make_gateway(
        runtime, register={"python": PlainPython()}, handlers={"template": {"template": "template {{ n }}"}}
    )
    assert gateway.worker is not None
    await until(lambda: gateway.worker.active)
    transactions = 0
    original = gateway.store.transaction

    @contextlib.asynccontextmanager
    async def counted():  # type: ignore[no-untyped-def]
        nonlocal transactions
        transactions += 1
        async with original() as conn:
            yield conn

    monkeypatch.setattr(gateway.store, "transaction", counted)
    count = 10
    async with gateway.store.transaction() as conn:  # all queued at once
        ids = [await service.emit(conn, kind, {"n": n}) for n in range(count)]
    for signal_id in ids:
        assert (await finished(gateway.store, signal_id)).state == "done"
        [run] = await runs_of(gateway.store, signal_id)
        assert run.state == "done" and run.started_at is not None and run.ended_at is not None
    await until_idle(gateway)
    assert [run.prompt for run in runtime.runs] == [f"{kind} {n}" for n in range(count)]
    # The emit, the first claim, one per Signal (two without inline), the claim that finds
    # none, and perhaps the recovery of a worker that had only just started leading.
    if inline:
        assert transactions <= count + 4
    else:
        assert transactions >= 2 * count + 1


async def until_idle(gateway) -> None:  # type: ignore[no-untyped-def]
    """Wait until the worker has nothing pending or processing."""

    async def idle() -> bool:
        async with gateway.store.read() as conn:
            signals = await service.list_signals(conn, 200, None)
        return all(signal.state in ("done", "failed") for signal in signals)

    await until(idle)


class Held(Recording):
    """Recording, the Run whose Prompt is ``held`` kept running until the test releases it."""

    def __init__(self, held: str) -> None:
        super().__init__()
        self.held, self.holding, self.released = held, asyncio.Event(), asyncio.Event()

    async def run(self, run: Any) -> None:
        await super().run(run)
        if run.prompt == self.held:
            self.holding.set()
            await self.released.wait()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_the_queue_order_holds_when_an_older_signal_commits_after_the_read_ahead(
    make_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the worker takes the next Signal ahead while a Run executes (signals.worker);
    a Signal emitted earlier than that one but committed after it was taken is still run first:
    the claim of the one taken ahead is refused, and the worker claims the older one."""
    from agent_gateway.store.queries import ledger as ledger_queries

    claims: list[tuple[str, bool]] = []
    claim_ahead = ledger_queries.claim_ahead

    async def claiming(conn: Any, queued: Any, *args: Any) -> Any:
        claimed, after = await claim_ahead(conn, queued, *args)
        claims.append((queued.signal.payload["n"], claimed))
        return claimed, after

    monkeypatch.setattr(ledger_queries, "claim_ahead", claiming)
    runtime = Held("A")
    gateway = await make_gateway(runtime, register={"k": TemplateHandler("k", "{{ n }}")})
    async with gateway.store.transaction() as conn:  # C is the Signal next once A is claimed
        first = await service.emit(conn, "k", {"n": "A"})
        late = await service.emit(conn, "k", {"n": "C"})
    await asyncio.wait_for(runtime.holding.wait(), 300)
    with clock.use(clock.FrozenClock("2026-11-21T10:00:00Z")):  # emitted before C, committed after it was taken
        older = await emit(gateway.store, "k", {"n": "B"})
    runtime.released.set()
    for signal_id in (first, older, late):
        assert (await finished(gateway.store, signal_id)).state == "done"
    assert [run.prompt for run in runtime.runs] == ["A", "B", "C"]
    # C's claim refused; B then claimed (in a transaction: the refused statement had drawn a
    # ledger number, so the next prediction fails once), and C after it.
    assert claims[:2] == [("A", True), ("C", False)]
    assert claims[-1] == ("C", True)


@pytest.mark.parametrize("database_url", ["sqlite", "postgresql"], indirect=True)
async def test_the_worker_steps_alone_only_on_postgresql_with_nothing_written_beside(
    make_gateway: GatewayFactory,
) -> None:
    """A step is one statement alone only where nothing else is written with it: no webhook
    endpoint of run.ended or signal.failed, no loop watching the Run ledger (whose wake-up
    a transaction sends)."""
    from agent_gateway.store.queries import ledger as ledger_queries
    from agent_gateway.webhooks import outbox

    gateway = await make_gateway(Recording())
    store, worker_ = gateway.store, gateway.worker
    assert worker_ is not None
    postgresql = store.dialect == "postgresql"
    assert worker_._alone() is postgresql
    for event in (outbox.RUN_ENDED, outbox.SIGNAL_FAILED):
        store.webhook_urls = {event: ("http://127.0.0.1:9/hook",)}
        assert not worker_._alone()
    store.webhook_urls = {outbox.MESSAGE_INBOUND: ("http://127.0.0.1:9/hook",)}
    assert worker_._alone() is postgresql
    store.watched = frozenset({ledger_queries.CHANNEL})
    assert not worker_._alone()
    store.webhook_urls, store.watched = {}, frozenset()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_on_postgresql_the_agent_has_its_run_before_the_next_signal_is_read_ahead(
    make_gateway: GatewayFactory,
) -> None:
    """The read ahead beside a Run (PostgreSQL) renders the next Signal's Prompts, which the
    agent need not wait for: each Run is handed over before its successor is rendered."""
    events: list[tuple[str, str]] = []

    class Rendering(TemplateHandler):
        def handle(self, signal: Signal) -> list[Prompt]:
            events.append(("render", signal.payload["n"]))
            return super().handle(signal)

    class Handed(Recording):
        async def run(self, run: Any) -> None:
            events.append(("run", run.prompt))
            await super().run(run)

    gateway = await make_gateway(Handed(), register={"k": Rendering("k", "{{ n }}")})
    names = ["A", "B", "C", "D"]
    async with gateway.store.transaction() as conn:  # all queued at once
        ids = [await service.emit(conn, "k", {"n": n}) for n in names]
    for signal_id in ids:
        assert (await finished(gateway.store, signal_id)).state == "done"
    for before, after in itertools.pairwise(names):
        assert events.index(("run", before)) < events.index(("render", after)), events
