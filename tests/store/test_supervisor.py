"""store.supervisor: a loop that raises is logged with its traceback once, counted, and restarted
with a capped backoff; a fault injected into each of the gateway's four loops (both backends)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.scheduler.timer import Timer
from agent_gateway.signals import retention
from agent_gateway.signals.handlers import TemplateHandler
from agent_gateway.signals.worker import Worker
from agent_gateway.store import leadership, supervisor
from agent_gateway.webhooks.deliverer import Deliverer
from tests.signals.conftest import Recording, emit, finished, until


class Fault(Exception):
    pass


def restarts(loop: str) -> float:
    return REGISTRY.get_sample_value("agent_gateway_loop_restarts_total", {"loop": loop}) or 0.0


def failures(caplog: pytest.LogCaptureFixture, loop: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "agent_gateway.store.supervisor" and r.getMessage().startswith(loop)]


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Each backoff the supervisor waits, recorded instead of slept."""
    waited: list[float] = []

    async def wait(stop: asyncio.Event | None, seconds: float) -> None:
        waited.append(seconds)
        await asyncio.sleep(0)

    monkeypatch.setattr(supervisor, "_wait", wait)
    return waited


def failing(times: int, exc: Callable[[int], BaseException] = lambda n: Fault(f"fault {n}")) -> Any:
    """Work that raises ``times`` times (``exc(n)`` the n-th time), then returns; ``calls`` counts it."""

    async def work() -> None:
        work.calls += 1  # type: ignore[attr-defined]
        if work.calls <= times:  # type: ignore[attr-defined]
            raise exc(work.calls)  # type: ignore[attr-defined]

    work.calls = 0  # type: ignore[attr-defined]
    return work


async def test_work_that_raises_is_logged_counted_and_restarted_until_it_returns(
    backoffs: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    work = failing(2)
    before = restarts("unit a")
    with caplog.at_level(logging.ERROR, logger="agent_gateway.store.supervisor"):
        await supervisor.supervise("unit a", work)
    assert work.calls == 3
    assert restarts("unit a") == before + 2
    logged = failures(caplog, "unit a")
    assert [r.getMessage() for r in logged] == ["unit a failed; restarting in 1.0s", "unit a failed; restarting in 2.0s"]
    assert [str(r.exc_info[1]) for r in logged if r.exc_info] == ["fault 1", "fault 2"]


async def test_the_same_failure_again_is_one_line_without_its_traceback(
    backoffs: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    work = failing(3, lambda n: Fault("the database went away"))
    with caplog.at_level(logging.ERROR, logger="agent_gateway.store.supervisor"):
        await supervisor.supervise("unit b", work)
    logged = failures(caplog, "unit b")
    assert [r.exc_info is not None for r in logged] == [True, False, False]
    assert logged[2].getMessage() == "unit b failed again (Fault, as before: 3 times in a row); restarting in 4.0s"


async def test_the_backoff_doubles_up_to_its_cap(backoffs: list[float]) -> None:
    await supervisor.supervise("unit c", failing(8))
    assert backoffs == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert max(backoffs) == supervisor.MAX_BACKOFF_S


async def test_stop_cuts_the_backoff_short_and_nothing_restarts() -> None:
    stop = asyncio.Event()
    work = failing(100)
    task = asyncio.create_task(supervisor.supervise("unit d", work, stop=stop))
    await until(lambda: work.calls == 1)
    stop.set()  # during the first backoff (a second, unpatched)
    await asyncio.wait_for(task, 60)
    assert work.calls == 1


async def test_a_cancel_is_never_caught(backoffs: list[float]) -> None:
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(supervisor.supervise("unit e", work))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert backoffs == []


async def test_leading_survives_work_that_raises(
    database_url: str, backoffs: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    """Before, anything but a database error ended ``lead``, and this process never led again."""
    from agent_gateway.store.engine import Store

    store = Store(database_url)
    work = failing(2, lambda n: KeyError(n))
    before = restarts("lead test")
    try:
        await asyncio.wait_for(leadership.lead(store, "lead test", work, retry_s=0.05, check_s=0.05), 300)
    finally:
        await store.close()
    assert work.calls == 3
    assert restarts("lead test") == before + 2


# --- a fault injected into each of the gateway's loops ---------------------------


@dataclasses.dataclass(frozen=True)
class Loop:
    name: str  # the supervisor's
    owner: type
    method: str  # what raises once
    changes: dict[str, Any]
    roles: frozenset[str] = frozenset({"api", "worker", "scheduler"})


ENDPOINT = config.WebhookEndpoint(
    url="http://127.0.0.1:9/hook", events=frozenset({"decision.published"}), secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
)
LOOPS = [
    Loop("signal worker", Worker, "recover", {}),
    Loop("scheduler timer", Timer, "step", {}),
    Loop("webhook deliverer", Deliverer, "step", {"webhooks": (ENDPOINT,)}),
    Loop("pruner", retention.Pruner, "prune_once", {"retention_deliveries_max_age": timedelta(days=7)}),
]


@pytest.mark.parametrize("loop", LOOPS, ids=[loop.name for loop in LOOPS])
async def test_a_fault_in_a_loop_is_logged_counted_and_the_loop_restarted(
    settings: config.Settings, loop: Loop, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(supervisor, "FIRST_BACKOFF_S", 0.01)
    real = getattr(loop.owner, loop.method)
    calls: list[int] = []

    async def faulty(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise Fault(f"injected into the {loop.name}")
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(loop.owner, loop.method, faulty)
    before = restarts(loop.name)
    gateway = Gateway(dataclasses.replace(settings, **loop.changes), loop.roles)
    with caplog.at_level(logging.ERROR, logger="agent_gateway.store.supervisor"):
        await gateway.start()
        try:
            await until(lambda: len(calls) >= 2)  # run again after the fault
            assert restarts(loop.name) == before + 1
            [logged] = failures(caplog, loop.name)
            assert logged.exc_info is not None and str(logged.exc_info[1]) == f"injected into the {loop.name}"
            assert all(gateway.loops_alive().values())
        finally:
            await gateway.stop()


async def test_the_signal_worker_leads_and_works_on_after_a_fault(
    settings: config.Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervisor, "FIRST_BACKOFF_S", 0.01)
    real = Worker.process_next
    calls: list[int] = []

    async def faulty(self: Worker) -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise Fault("a bug in the worker")
        return await real(self)

    monkeypatch.setattr(Worker, "process_next", faulty)
    gateway = Gateway(settings)
    gateway.handlers.register("k", TemplateHandler("k", "hello"))
    runtime = gateway.runtime = Recording()
    await gateway.start()
    try:
        # Run by the same process's worker, restarted after the fault, leading all along.
        signal = await finished(gateway.store, await emit(gateway.store, "k", {}))
        assert (signal.state, signal.error) == ("done", None)
        assert [run.prompt for run in runtime.runs] == ["hello"]
        assert gateway.worker is not None and gateway.worker.active
    finally:
        await gateway.stop()

