"""The Signal Worker: claims Signals one at a time and executes their Runs.

Shape (after procrastinate's worker): at start, fail what a stopped process
left ``processing`` (``service.recover``), then drain — claim the oldest pending
Signal until none is left — then wait on the ``signals`` channel, which
``service.emit`` wakes once the emitting transaction commits, with a sweep
interval only as a safety net. :meth:`Worker.stop` sets an Event; a Run in
progress is then cancelled (the command runtime stops its program) and
recorded as failed. Outcome writes are shielded from cancellation. A Run the
operator cancels (``service.cancel_run``, from any process) is stopped the same
way once the worker sees it is no longer ``running``, and ends its Signal.

Transactions: the claim; one that records a Signal's Runs and starts the
first; then one per Run that ends it and starts the next, the last of which
also ends the Signal (unless a post phase follows) and claims the next pending
Signal. When the claimed Signal's Handler is ``inline`` (a ``[handlers]``
template: pure and quick), the claiming transaction also renders its Prompts,
records its Runs and starts the first, so a queue of single-Run Signals drains
at one commit per Signal; on PostgreSQL that transaction's ends and claim are one
statement (``signals.end_and_claim``). Either way a Run is always recorded
``running`` before the agent sees its Prompt, and states stay one-way.

On PostgreSQL, where each statement is a round trip, the worker reads ahead: while
a Signal's last Run executes it reads the oldest pending Signal and renders its
Prompts (an inline Handler's), and one statement that commits alone then ends the
Run and its Signal, claims the one read if it is still the oldest pending, records
its Runs, starts the first and appends its ledger entry
(``store.queries.ledger.claim_ahead``); a claim after the queue was empty is that
read and that statement. Where that statement claims nothing (another Signal came
first, the ledger's prediction failed) the worker claims in a transaction as above.
It does so whenever nothing else must be written with a step: no webhook endpoint of
``run.ended`` or ``signal.failed``, no loop watching the ledger.

Runs are serial across the gateway: one worker, one Run at a time. No
timeouts are imposed. Logs carry ids, kinds, Sessions and states, never a
Prompt, a payload or an error text (which may quote either).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, ids
from agent_gateway.ledger.service import Ledger
from agent_gateway.ops import metrics
from agent_gateway.runtimes.runtime import RunFailed, Runtime
from agent_gateway.signals import service
from agent_gateway.signals.handlers import Handlers, Prompt, TemplateFailed
from agent_gateway.store import direct
from agent_gateway.store.engine import Store
from agent_gateway.store.notifications import Subscription
from agent_gateway.store.queries import ledger as ledger_queries
from agent_gateway.store.queries import runs as run_queries
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.store.queries.runs import Run
from agent_gateway.store.queries.signals import Queued, Signal
from agent_gateway.store.vacuum import Vacuum
from agent_gateway.webhooks import outbox

logger = logging.getLogger(__name__)

# The wake-up after commit is what makes the worker prompt; the sweep only
# catches Signals emitted where no wake-up reaches this process.
SWEEP_INTERVAL_S = 5.0
# The Run ledger's tree catches up with the Runs' entries (Ledger.integrate) once the queue has
# stayed empty this long: never between a Run and a Signal close behind it, whose start it would
# delay (every reader of the tree grows it first, so nothing reads it behind).
INTEGRATE_IDLE_S = 0.5
# A Run in progress is woken when an operator cancels a Run; it also reads its own
# state this often, in case the wake-up was lost (one primary-key read, no hot poll).
CANCEL_CHECK_S = 5.0


class Worker:
    """The Signal Worker of one process; ``Gateway`` runs :meth:`run` while this process leads."""

    def __init__(self, store: Store, handlers: Handlers, runtime: Runtime, ledger: Ledger) -> None:
        self.store = store
        self.handlers = handlers
        self.runtime = runtime
        # Each Run's entry goes on the Run ledger in the transaction that starts it.
        self.ledger = ledger
        # Its steps written alone, on PostgreSQL on a connection of its own.
        self._alone_connection = store.alone_writer()
        self._stop = asyncio.Event()
        self._subscription: Subscription | None = None
        self._cancels: Subscription | None = None
        # Each claim leaves dead row versions in the queue's index (store.vacuum).
        self._vacuum = Vacuum(store, "signals")
        # The last claim found no Signal pending.
        self._queue_empty = False
        # The read ahead while a Signal's last Run executes (PostgreSQL; see the module's docstring).
        self._ahead: asyncio.Task[_Ahead | None] | None = None
        # The oldest pending Signal as the last statement alone saw it, so that the read ahead
        # need not read it again (None: none was, or it is not known).
        self._seen: Queued | None = None
        self.active = False

    def stop(self) -> None:
        """Ask the worker to stop: it cancels a Run in progress and returns from :meth:`run`."""
        self._stop.set()
        if self._subscription is not None:
            self._subscription.wake()
        if self._cancels is not None:
            self._cancels.nudge()  # a Run in progress stops

    def abandon(self) -> None:
        """Kill the agent program at once: this process has found its leadership lost (``leadership.lead``
        calls this before it cancels :meth:`run`), and another may start its own agent soon."""
        kill = getattr(self.runtime, "kill", None)
        if kill is not None and kill():
            logger.warning("leadership lost: the agent program was killed at once", extra={"action": "agent_killed"})

    async def run(self) -> None:
        """Recover, then drain and wait until :meth:`stop`."""
        subscription = self._subscription = self.store.subscribe(service.CHANNEL)
        self._cancels = self.store.subscribe(service.CANCEL_CHANNEL)
        self.active = True
        try:
            # A long-lived agent (the persistent runtime) starts with the leadership and stops with it.
            start = getattr(self.runtime, "start", None)
            if start is not None:
                try:
                    await start()
                except Exception as exc:  # never the queue's end: each Run starts the agent, or fails saying why
                    logger.error(
                        "Signal Worker: the agent program could not be started ahead of the first Run: %s",
                        type(exc).__name__, extra={"action": "agent_start_failed"},
                    )
            # A failure here (the database went away, a bug) raises: leadership.lead runs this under
            # store.supervisor, which logs, counts and restarts it (recovering again, which fails a
            # Signal this pass left processing).
            if not self._stop.is_set():
                await self.recover()
            while not self._stop.is_set():
                while not self._stop.is_set() and await self.process_next():
                    pass
                if not await subscription.wait(INTEGRATE_IDLE_S) and not self._stop.is_set():
                    await self.ledger.integrate()
                    await subscription.wait(SWEEP_INTERVAL_S)
                self._seen = None  # seen before the wait: read again
        finally:
            self.active = False
            if self._ahead is not None:
                self._ahead.cancel()
            self._ahead = self._seen = None  # a later leadership reads afresh
            await self._vacuum.close()
            self.store.unsubscribe(service.CHANNEL, subscription)
            self.store.unsubscribe(service.CANCEL_CHANNEL, self._cancels)
            close = getattr(self.runtime, "close", None)
            if close is not None:
                await asyncio.shield(close())

    async def recover(self) -> None:
        """Fail the Signals (and their unfinished Runs) a stopped process left ``processing``."""
        async with self.store.transaction() as conn:
            failed = await service.recover(conn)
        for signal_id in failed:
            logger.warning(
                "Signal %s failed: left processing by a stopped process, not re-run", signal_id,
                extra={"action": "recover_signal"},
            )

    async def process_next(self) -> bool:
        """Claim the oldest pending Signal and process it to its end; False when none is pending.

        The transaction that ends a Signal also claims the next one, so while the
        queue is not empty this goes on with the Signals claimed that way; when that
        claim found none, so does this (a claim again at once would find none either:
        a Signal emitted since wakes the subscription :meth:`run` waits on).
        """
        claimed = await self._claim_first()
        if claimed is None:
            return False
        _log_claimed(claimed)
        while claimed is not None:
            try:
                claimed = await self._process(claimed)
            except Exception as exc:  # a bug or the database: the Signal must still end, with the reason
                error = f"the Signal Worker failed while processing this Signal: {_describe(exc)}"
                step = _Step(claimed.signal, abandon=error, end_signal=True, signal_error=error, claim_next=False)
                await asyncio.shield(self._write(step))
                claimed = None
        return not self._queue_empty

    async def _claim_first(self) -> _Claimed | None:
        """Claim the oldest pending Signal: by a read and one statement alone where it can, else in a transaction."""
        if self._alone():
            ahead = await self._read_ahead()
            if ahead.queued is None:
                self._queue_empty = True
                return None
            if ahead.runs:
                async with self._alone_connection() as conn:
                    claimed = await self._claimed_ahead(conn, ahead, None)
                if claimed is not None:
                    return claimed
        self._seen = None
        async with self.store.transaction() as conn:
            return await self._claim(conn)

    def _alone(self) -> bool:
        """Whether a step may be one statement alone (PostgreSQL, nothing else written with it)."""
        store = self.store
        return (
            store.dialect == "postgresql" and ledger_queries.CHANNEL not in store.watched
            and not store.webhook_urls.get(outbox.RUN_ENDED) and not store.webhook_urls.get(outbox.SIGNAL_FAILED)
        )

    async def _read_ahead(self) -> _Ahead:
        """The oldest pending Signal (as the last statement alone saw it, else read now) and, when
        its Handler is inline, its Runs (not yet recorded)."""
        queued, self._seen = self._seen, None
        if queued is None:
            queued = await signal_queries.oldest_pending(self.store)
        if queued is None:
            return _Ahead(None)
        handler = self.handlers.get(queued.signal.kind)
        if not getattr(handler, "inline", False):
            return _Ahead(queued)
        try:
            return _Ahead(queued, _runs(queued.signal, _checked(handler.handle(queued.signal))))  # type: ignore[union-attr]
        except Exception:  # the claim in a transaction asks the Handler again, and records why
            return _Ahead(queued)

    async def _reading_ahead(self) -> _Ahead | None:
        """:meth:`_read_ahead` as a task beside a Run; None when the read failed (the step then
        claims in a transaction, which meets the same database)."""
        try:
            return await self._read_ahead()
        except Exception as exc:
            logger.warning(
                "Signal Worker: cannot read the next Signal ahead: %s", type(exc).__name__,
                extra={"action": "read_ahead_error"},
            )
            return None

    async def _claimed_ahead(
        self, conn: direct.Alone, ahead: _Ahead, ending: dict[str, str | None] | None
    ) -> _Claimed | None:
        """Claim what was read ahead, alone (``ahead.queued`` with its Runs), ending what ``ending``
        names in the same statement; None when it claimed nothing."""
        assert ahead.queued is not None and ahead.runs
        now = clock.now_iso()
        recorded = run_queries.to_record(
            signal_id=ahead.queued.signal.id, prompts=[(run.id, run.session, run.prompt) for run in ahead.runs],
            first_started_at=now,
        )
        claimed, after = await self.ledger.claimed_ahead(conn, ahead.queued, recorded, now, ending)
        self._seen_next(after)
        if not claimed:
            self._queue_empty = False  # the claim in a transaction follows
            return None
        self._vacuum.claimed()
        return _Claimed(ahead.queued.signal, ahead.runs)

    def _seen_next(self, queued: Queued | None) -> None:
        """Keep the oldest pending Signal a statement alone saw, for the next read ahead; none
        pending ends the drain, as a claim that finds none does."""
        self._seen = queued
        self._queue_empty = queued is None

    async def _claim(self, conn: AsyncConnection) -> _Claimed | None:
        """Claim the oldest pending Signal, within ``conn``'s transaction.

        When its Handler is ``inline``, its Prompts are rendered here and its Runs
        recorded, the first started. A Handler that raises or returns what cannot
        be stored is left to :meth:`_process`, which asks it again and records why.
        """
        return await self._claimed(conn, await signal_queries.claim_oldest(conn))

    async def _claimed(self, conn: AsyncConnection, signal: Signal | None) -> _Claimed | None:
        """:meth:`_claim` for a Signal that ``conn``'s transaction has just claimed."""
        self._queue_empty = signal is None
        if signal is None:
            return None
        self._vacuum.claimed()
        handler = self.handlers.get(signal.kind)
        if not getattr(handler, "inline", False):
            return _Claimed(signal)
        try:
            runs = _runs(signal, _checked(handler.handle(signal)))  # type: ignore[union-attr]
        except Exception:
            return _Claimed(signal)
        now = clock.now_iso()
        recorded = run_queries.to_record(
            signal_id=signal.id, prompts=[(run.id, run.session, run.prompt) for run in runs], first_started_at=now
        )
        await self.ledger.started(conn, signal, runs[:1], now, recorded)
        return _Claimed(signal, runs)

    async def _process(self, claimed: _Claimed) -> _Claimed | None:
        """Handle one claimed Signal, record and execute its Runs, run the post phase, end it.

        Returns the next Signal, claimed by the transaction that ended this one.
        """
        signal = claimed.signal
        handler = self.handlers.get(signal.kind)
        if handler is None:
            error = f"no Signal Handler is registered for kind {signal.kind!r}"
            return await self._write(_Step(signal, end_signal=True, signal_error=error))
        step: _Step | None
        if claimed.runs is None:
            try:
                prompts = _checked(await _result(handler.handle(signal)))
            except Exception as exc:
                error = f"the Signal Handler for kind {signal.kind!r} failed: {_describe(exc)}"
                return await self._write(_Step(signal, end_signal=True, signal_error=error))
            runs = _runs(signal, prompts)
            step = _Step(signal, record=runs)
        else:  # recorded by the claim, the first Run started
            runs = claimed.runs
            step = None if runs else _Step(signal)
        post = getattr(handler, "post", None)

        # Each transaction ends one Run and starts the next (the first also records them
        # all), and, when no post phase follows, the last one ends the Signal too.
        # A Run cancelled by the operator ends its Signal: the Runs after it were failed
        # with it (service.cancel_run), so none is started.
        failures: list[tuple[Run, str]] = []
        stopped = cancelled = False
        for run in [*runs, None]:
            if step is None:  # the claim started this Run
                assert run is not None
                started = time.perf_counter()
                if self._stop.is_set():
                    error = service.STOPPED_RUN_ERROR
                else:
                    error, cancelled = await self._execute(run, ahead=run is runs[-1] and post is None)
            else:
                if run is not None and cancelled:
                    run = None
                if run is not None and self._stop.is_set():
                    stopped, step.fail_pending, run = True, True, None
                step.start = run
                if run is None and post is None:
                    step.end_signal, step.signal_error = True, _signal_error(failures, len(runs), stopped)
                next_claimed = await asyncio.shield(self._write(step))
                if step.ended_cancelled:  # cancelled as it ended on its own; so are the Runs after it
                    ended = step.ended[0]  # type: ignore[index]
                    failures = [failure for failure in failures if failure[0] is not ended]
                    failures.append((ended, service.CANCELLED_ERROR))
                    cancelled = True
                if run is None:
                    break
                if step.start_refused is not None:  # cancelled before it started
                    logger.warning(
                        "Run %s cancelled by the operator before it started", run.id,
                        extra={"action": "cancel_run", "run": run.id, "signal": signal.id},
                    )
                    failures.append((run, step.start_refused))
                    cancelled, step = True, _Step(signal)
                    continue
                started = time.perf_counter()
                error, cancelled = await self._execute(run, ahead=run is runs[-1] and post is None)
            if error is not None:
                failures.append((run, error))
                stopped = stopped or self._stop.is_set()
            step = _Step(signal, ended=(run, error), ran_s=time.perf_counter() - started, cancelled=cancelled)

        if post is None:
            return next_claimed
        post_error = None
        try:
            await _result(post(signal, bool(failures) or stopped))
        except Exception as exc:
            post_error = f"the post phase of the Signal Handler for kind {signal.kind!r} failed: {_describe(exc)}"
        error = _signal_error(failures, len(runs), stopped, post_error)
        return await asyncio.shield(self._write(_Step(signal, end_signal=True, signal_error=error)))

    async def _execute(self, run: Run, *, ahead: bool) -> tuple[str | None, bool]:
        """Hand a started Run to the runtime; return its error (None when done), and whether
        the operator cancelled it. ``ahead``: it is its Signal's last, so the next Signal is read meanwhile."""
        # The Run's task first: tasks start in the order they are made, and the read ahead may
        # render the next Signal's Prompts before it awaits anything, which the agent need not wait for.
        call = asyncio.create_task(self._call_runtime(run), name=f"run {run.id}")
        if ahead and self._alone():
            self._ahead = asyncio.create_task(self._reading_ahead(), name=f"read ahead of {run.id}")
        watching = asyncio.create_task(self._interrupted(run), name=f"stop or cancel of {run.id}")
        try:
            await asyncio.wait({call, watching}, return_when=asyncio.FIRST_COMPLETED)
            if watching.done() and not call.done() and not self._stop.is_set():
                logger.warning(
                    "Run %s cancelled by the operator; stopping the agent program", run.id,
                    extra={"action": "cancel_run", "run": run.id, "signal": run.signal_id},
                )
        finally:
            # Stopped, cancelled by the operator, or the worker cancelled (leadership lost):
            # the agent program must stop too (the runtime's cancellation path stops it). A
            # cancelled worker leaves the outcome to recovery, as a killed process would.
            watching.cancel()
            if not call.done():
                call.cancel()
                await asyncio.wait({call})
        if not call.cancelled():
            return call.result(), False
        if self._stop.is_set():
            return service.STOPPED_RUN_ERROR, False
        return service.CANCELLED_ERROR, True

    async def _interrupted(self, run: Run) -> None:
        """Return once the worker is stopped, or ``run`` is no longer ``running`` in the database
        (an operator cancelled it).

        Woken by :meth:`stop`, and by ``service.cancel_run`` from any process; reads the
        Run's state at each wake-up and every :data:`CANCEL_CHECK_S` (a wake-up may be
        lost). A database error is retried at the next check: the Run goes on meanwhile.
        """
        cancels = self._cancels
        assert cancels is not None  # subscribed for as long as run() works
        while not self._stop.is_set():
            await cancels.wait(CANCEL_CHECK_S)
            if self._stop.is_set():
                return
            try:
                async with self.store.read() as conn:
                    current = await run_queries.get(conn, id=run.id)
            except Exception as exc:
                logger.warning(
                    "cannot read the state of Run %s: %s", run.id, type(exc).__name__,
                    extra={"action": "cancel_check_error", "run": run.id},
                )
                continue
            if current is None or current.state != run_queries.RUNNING:
                return

    async def _call_runtime(self, run: Run) -> str | None:
        try:
            await self.runtime.run(run)
        except RunFailed as exc:
            return exc.message
        except Exception as exc:
            return f"the runtime failed: {_describe(exc)}"
        return None

    async def _write(self, step: _Step) -> _Claimed | None:
        """One transaction of a Signal's progress; each transition logged once committed.

        Returns the next Signal when the step ended this one and claimed another.
        """
        signal = step.signal
        ahead = await self._taken_ahead()
        usual = step.ends_and_claims() and not self._stop.is_set()  # the usual step, in fewer statements
        if usual and ahead is not None and self._alone():
            async with self._alone_connection() as alone:
                ending = signal_queries.ending(**self._ends(step, clock.now_iso()))
                if ahead.queued is not None and ahead.runs:
                    claimed = await self._claimed_ahead(alone, ahead, ending)
                else:
                    claimed = None
                    self._seen_next(await signal_queries.end(alone, ending))
        else:
            self._seen = None
            async with self.store.transaction() as conn:
                now = clock.now_iso()
                if usual:
                    ended = step.ended[0]  # type: ignore[index]
                    claimed = await self._claimed(conn, await signal_queries.end_and_claim(conn, **self._ends(step, now)))
                    if not step.cancelled:  # a cancelled Run's end was reported by its cancel
                        await outbox.runs_ended(conn, [ended.id])
                    if step.signal_error is not None or step.cancelled:
                        await outbox.signals_failed(conn, [signal.id])
                else:
                    claimed = await self._apply(conn, step, now)
        if step.ended is not None:
            ended, error = step.ended
            state = run_queries.DONE if error is None else run_queries.FAILED
            metrics.runs.labels(state).inc()
            metrics.run_duration.observe(step.ran_s)
            logger.log(
                logging.INFO if error is None else logging.WARNING,
                "Run %s %s (Signal %s, session %s)", ended.id, state, signal.id, ended.session,
                extra={
                    "action": "end_run", "run": ended.id, "signal": signal.id, "status": state,
                    "duration_ms": round(step.ran_s * 1000, 3),
                },
            )
        if step.start is not None and step.start_refused is None:
            _log_started(step.start, signal)
        if step.end_signal:
            logger.info(
                "Signal %s %s (kind %s)", signal.id, "done" if step.signal_error is None else "failed", signal.kind,
                extra={
                    "action": "finish_signal", "signal": signal.id,
                    "status": signal_queries.DONE if step.signal_error is None else signal_queries.FAILED,
                },
            )
        if claimed is not None:
            _log_claimed(claimed)
        return claimed

    async def _taken_ahead(self) -> _Ahead | None:
        """What was read ahead beside the Run this step ends (None when nothing was, or the read failed)."""
        ahead, self._ahead = self._ahead, None
        return None if ahead is None else await ahead

    @staticmethod
    def _ends(step: _Step, now: str) -> dict[str, Any]:
        """The ends of a usual step, its Run's and its Signal's, as ``signals.end_and_claim`` takes them."""
        ended, error = step.ended  # type: ignore[misc]
        return {
            "run_id": ended.id, "run_error": _storable(error), "ended_at": now, "signal_id": step.signal.id,
            "signal_error": _storable(step.signal_error),
            "signal_error_if_cancelled": _storable(
                step.signal_error if step.cancelled else _with_cancel(step.signal_error, ended)
            ),
        }

    async def _apply(self, conn: AsyncConnection, step: _Step, now: str) -> _Claimed | None:
        """The writes of ``step`` in ``conn``'s transaction, in order; the next Signal when it claims one."""
        signal = step.signal
        ended_runs: list[str] = []
        # The Run this step starts is recorded running when the step records it.
        starts_recorded = bool(step.record) and step.start is step.record[0]
        if step.record:
            rows = [(run.id, run.session, run.prompt) for run in step.record]
            if starts_recorded:  # recorded with the started one's ledger entry
                recorded = run_queries.to_record(signal_id=signal.id, prompts=rows, first_started_at=now)
                await self.ledger.started(conn, signal, [step.start], now, recorded)  # type: ignore[list-item]
            else:
                await run_queries.record(conn, signal_id=signal.id, prompts=rows)
        if step.ended is not None:
            ended, error = step.ended
            ran = await run_queries.finish(conn, id=ended.id, error=_storable(error), ended_at=now)
            if ran:
                ended_runs.append(ended.id)
            elif not step.cancelled:
                # The operator cancelled it as it ended: the cancel stands, and fails the Signal.
                step.ended_cancelled = True
                step.signal_error = _with_cancel(step.signal_error, ended)
        if step.start is not None and not starts_recorded:
            if await run_queries.start(conn, id=step.start.id, started_at=now):
                await self.ledger.started(conn, signal, [step.start], now)
            else:
                # An operator cancelled it, or another Run of its Signal, meanwhile: say which.
                refused = await run_queries.get(conn, id=step.start.id)
                step.start_refused = refused.error if refused is not None else service.CANCELLED_ERROR
        if step.abandon is not None:
            ended_runs += await run_queries.fail_unfinished(
                conn, state=run_queries.RUNNING, error=step.abandon, ended_at=now, signal_id=signal.id
            )
        if step.fail_pending or step.abandon is not None:
            ended_runs += await run_queries.fail_unfinished(
                conn, state=run_queries.PENDING, error=service.NOT_STARTED_RUN_ERROR, ended_at=now,
                signal_id=signal.id,
            )
        await outbox.runs_ended(conn, ended_runs)
        if step.end_signal:
            finished = await signal_queries.finish(conn, id=signal.id, error=_storable(step.signal_error))
            if finished and step.signal_error is not None:
                await outbox.signals_failed(conn, [signal.id])
            if step.claim_next and not self._stop.is_set():
                return await self._claim(conn)
        return None


@dataclasses.dataclass
class _Ahead:
    """What the worker read ahead: the oldest pending Signal (None when none was), and its Runs,
    not yet recorded, when its Handler is inline."""

    queued: Queued | None
    runs: list[Run] | None = None


@dataclasses.dataclass
class _Claimed:
    """A claimed Signal; ``runs`` when the claim also recorded its Runs and started the first."""

    signal: Signal
    runs: list[Run] | None = None


def _log_started(run: Run, signal: Signal) -> None:
    logger.info(
        "Run %s started (Signal %s, session %s)", run.id, signal.id, run.session,
        extra={"action": "start_run", "run": run.id, "signal": signal.id},
    )


def _log_claimed(claimed: _Claimed) -> None:
    signal = claimed.signal
    logger.info(
        "Signal %s claimed (kind %s)", signal.id, signal.kind, extra={"action": "claim_signal", "signal": signal.id}
    )
    if claimed.runs:
        _log_started(claimed.runs[0], signal)


@dataclasses.dataclass
class _Step:
    """The writes of one transaction, applied in this order."""

    signal: Signal
    record: list[Run] = dataclasses.field(default_factory=list)
    ended: tuple[Run, str | None] | None = None
    cancelled: bool = False  # ``ended`` was cancelled by the operator, and so recorded already
    ran_s: float = 0.0  # how long the ended Run executed
    start: Run | None = None
    start_refused: str | None = None  # set by the write: ``start`` had been cancelled (this error), so it did not start
    ended_cancelled: bool = False  # set by the write: ``ended`` had been cancelled, so it was not ended
    fail_pending: bool = False
    abandon: str | None = None  # fail the running Run with this error, and the pending ones
    end_signal: bool = False
    signal_error: str | None = None
    claim_next: bool = True

    def ends_and_claims(self) -> bool:
        """Whether this step only ends its last Run and its Signal, then claims the next."""
        return (
            self.ended is not None and self.end_signal and self.claim_next
            and not (self.record or self.start or self.abandon is not None or self.fail_pending)
        )


def _runs(signal: Signal, prompts: list[Prompt]) -> list[Run]:
    """One pending Run per Prompt, in order; a fresh Session is ``run_<run id>``."""
    runs = []
    for prompt in prompts:
        run_id = ids.new()
        session = f"run_{run_id}" if prompt.session is None else prompt.session
        runs.append(Run(run_id, signal.id, session, prompt.text, run_queries.PENDING, None, None, None))
    return runs


def _with_cancel(signal_error: str | None, run: Run) -> str:
    """``signal_error`` when ``run``, which the worker saw end, turns out cancelled by the operator."""
    cancel = f"Run {run.id} (session {run.session}) failed: {service.CANCELLED_ERROR}"
    return cancel if signal_error is None else f"{signal_error}; {cancel}"


def _signal_error(
    failures: list[tuple[Run, str]], total: int, stopped: bool, post_error: str | None = None
) -> str | None:
    """The whole story of a Signal that did not go well; None when it is done."""
    errors = []
    if stopped:
        errors.append("the gateway stopped while this Signal was processing")
    if failures:
        described = "; ".join(f"Run {run.id} (session {run.session}) failed: {error}" for run, error in failures)
        errors.append(described if len(failures) == 1 else f"{len(failures)} of {total} Runs failed: {described}")
    if post_error is not None:
        errors.append(post_error)
    return "; ".join(errors) or None


async def _result(value: Any) -> Any:
    """A Handler method may be plain or a coroutine function."""
    return await value if inspect.isawaitable(value) else value


def _checked(prompts: Any) -> list[Prompt]:
    """The Handler's Prompts, refused (TypeError/ValueError) unless each is storable as a Run."""
    if not isinstance(prompts, Iterable) or isinstance(prompts, (str, bytes, dict)):
        raise TypeError(f"handle() must return a list of Prompts, not {type(prompts).__name__}")
    checked = list(prompts)
    for prompt in checked:
        if not isinstance(prompt, Prompt):
            raise TypeError(f"handle() returned a {type(prompt).__name__}, not a Prompt")
        if not isinstance(prompt.text, str):
            raise TypeError(f"a Prompt's text must be a string, not {type(prompt.text).__name__}")
        if prompt.session is not None and (not isinstance(prompt.session, str) or not prompt.session):
            raise TypeError("a Prompt's session must be a non-empty string, or None for a fresh Session")
        for value in (prompt.text, prompt.session or ""):
            if _storable(value) != value:
                raise ValueError("a Prompt or Session contains a NUL character or a lone surrogate")
    return checked


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TemplateFailed):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _storable(text: str | None) -> str | None:
    """Text both backends store: PostgreSQL refuses NUL, and UTF-8 has no lone surrogates."""
    if text is None:
        return None
    return text.encode("utf-8", errors="replace").decode("utf-8").replace("\x00", "\ufffd")


