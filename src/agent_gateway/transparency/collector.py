"""The collector: submits a log's newest checkpoint to every witness and keeps their cosignatures.

One collector per log (``transparency.service.Log``: the Decision log, the Run ledger), the same
code for each. It runs beside the log, never on a request's path: a publish (a Run's start) is
never delayed, blocked or failed by a witness. It works in the leading process only
(``leadership.lead``, like the Signal Worker), under ``supervisor.supervise``. An append in any
process wakes it (the log's ``channel``, across processes through the store's notifications); it
also looks every :data:`SWEEP_S`, for a wake-up lost while the database restarted. Each pass signs
the checkpoint of the tree as it is then, so that however many entries were appended since the
last pass, a witness gets one request, and passes are at least :data:`MIN_PASS_INTERVAL_S` apart:
under load, entries are coalesced into one request a second to each witness whatever the rate. A witness's state (the size it
holds, which a request is submitted from: the size it last cosigned, from the table at start, corrected by its 409
answers) is this process's; a new leader reads it again.

Each witness's request is a task of its own, bounded as a whole by :data:`REQUEST_TIMEOUT_S` and its answer by
:data:`MAX_ANSWER_BYTES`: a slow or hostile witness delays only itself (a pass does not wait for it; it is sent the
newest checkpoint once it has answered), and at most one request to a witness is in flight.

A witness that fails (unreachable, a 5xx) is tried again after a backoff that doubles from
:data:`FIRST_RETRY_S` up to :data:`MAX_RETRY_S`; one that refuses the log (403, 404, a
cosignature that does not verify) is a setting to check, tried again every :data:`MAX_RETRY_S`.
Each change of a witness's state is one log line, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time

import httpx

from agent_gateway.ops import metrics
from agent_gateway.store import notifications
from agent_gateway.store.engine import Store
from agent_gateway.transparency import note, service, witness

logger = logging.getLogger(__name__)

# How often the leader looks for a grown tree without a wake-up: the correctness fallback only.
SWEEP_S = 5.0
# The least time from a pass's start to the next one's: under load, at most one request a second
# to each witness (each pass competes with the requests for the CPU and, on SQLite, the write
# lock), at the cost of up to this much latency to a publish that comes during a pass.
MIN_PASS_INTERVAL_S = 1.0
FIRST_RETRY_S = 1.0
MAX_RETRY_S = 60.0
# The whole of one request (connecting, sending, the answer's last byte): httpx's own timeout bounds each read only,
# and a witness that sends a byte every few seconds would hold its request for ever.
REQUEST_TIMEOUT_S = 10.0
# A cosignature answer is a few hundred bytes (a line per key of the witness): a larger one is not read further.
MAX_ANSWER_BYTES = 64 * 1024
# 409s in a row, each naming another size, that one submission follows before it counts as a failure: an honest witness
# needs one (we resubmit from the size it names), and one that names sizes without end must not keep us asking at once.
MAX_RESYNCS = 3
# Every witness's requests, kept alive between passes (tlog-witness asks clients to).
_CONNECTIONS_PER_WITNESS = 2


@dataclasses.dataclass
class _State:
    """What the collector knows of one witness."""

    index: int  # its [[transparency.witnesses]] table
    size: int  # the size it holds as far as we know, which a request is submitted from (0: none we know of)
    cosigned: int  # the largest size whose cosignature by it we stored (0: none): it is asked until that is the log's
    status: str = "new"  # "ok", "resync", "failing" or "refused": a line is logged when it changes
    reason: str = ""
    retry: float = 0.0  # the backoff after the last failure
    next_at: float = 0.0  # monotonic: not asked before then
    request: asyncio.Task[None] | None = None  # its submission in flight


class Collector:
    """Collects the configured witnesses' cosignatures of the newest checkpoint of ``log`` (signed
    by ``checkpoints``; by default the Decision log's)."""

    def __init__(
        self, store: Store, checkpoints: service.Checkpoints, witnesses: list[service.Witness],
        log: service.Log = service.DECISIONS,
    ) -> None:
        self._store = store
        self._checkpoints = checkpoints
        self._witnesses = witnesses
        self._log = log
        self._stop = asyncio.Event()
        self._published: notifications.Subscription | None = None
        self.active = False  # whether this process leads the collection (and runs a pass)

    def stop(self) -> None:
        self._stop.set()
        if self._published is not None:
            self._published.wake()

    async def run(self) -> None:
        """Pass after pass until :meth:`stop`; what it cannot do (the database gone) raises."""
        # Subscribed before the first pass: a publish during it wakes the next one.
        published = self._published = self._store.subscribe(self._log.channel)
        self.active = True
        try:
            await self._passes(published)
        finally:
            self.active = False
            self._store.unsubscribe(self._log.channel, published)

    async def _passes(self, published: notifications.Subscription) -> None:
        vkeys = [configured.key.vkey() for configured in self._witnesses]
        async with self._store.read() as conn:
            sizes = await self._log.cosignatures.last_sizes(conn, vkeys)
        states = [_State(index, sizes.get(vkey, 0), sizes.get(vkey, 0)) for index, vkey in enumerate(vkeys)]
        for configured, state in zip(self._witnesses, states):
            metrics.witness_cosigned_size.labels(self._log.name, configured.key.name).set(state.cosigned)
        limits = httpx.Limits(max_connections=_CONNECTIONS_PER_WITNESS * len(states))
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
            try:
                while not self._stop.is_set():
                    for state in states:
                        if state.request is not None and state.request.done():
                            request, state.request = state.request, None
                            request.result()  # what a submission could not do (the database gone) raises here
                    started = time.monotonic()
                    signed = await self._checkpoints.latest()
                    text = signed[: signed.rindex(b"\n\n") + 1]
                    size = note.Checkpoint.parse(text).size
                    for state in states:
                        if state.request is None and state.cosigned != size and state.next_at <= started:
                            state.request = asyncio.create_task(self._submit(client, state, signed, text, size))
                            # Its answer ends the wait: the witness is sent the newest checkpoint if it grew meanwhile.
                            state.request.add_done_callback(lambda _: published.nudge())
                    # Until a publish, an answer, or until a witness that is behind is due again.
                    now = time.monotonic()
                    idle = [state for state in states if state.request is None]
                    behind = [state.next_at - now for state in idle if state.cosigned != size]
                    await published.wait(max(0.0, min([SWEEP_S, *behind])))
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(started + MIN_PASS_INTERVAL_S - time.monotonic()):
                            await self._stop.wait()
            finally:
                # Before the client closes: a request cut short by it would be a witness failing.
                requests = [state.request for state in states if state.request is not None]
                for request in requests:
                    request.cancel()
                await asyncio.gather(*requests, return_exceptions=True)

    async def _submit(self, client: httpx.AsyncClient, state: _State, signed: bytes, text: bytes, size: int) -> None:
        configured = self._witnesses[state.index]
        for _ in range(MAX_RESYNCS):
            answer = await self._add_checkpoint(client, configured, state.size, signed, text, size)
            if not (isinstance(answer, witness.Conflict) and answer.size is not None and answer.size != state.size):
                break
            # tlog-witness: resubmit at once from the size the witness holds. That may be this very size: it
            # cosigned it but the cosignature was lost to us (its answer not read in time, the gateway stopped
            # before storing it, a restored backup); from an old size equal to the checkpoint's, with no proof,
            # it cosigns the same root again.
            state.size = answer.size
            self._change(state, configured, "resync", f"holds tree size {answer.size}; resubmitting from it")
        else:
            answer = witness.Failed(f"{MAX_RESYNCS} answers 409 in a row, each naming another tree size")
        await self._record(state, configured, answer, size)

    async def _add_checkpoint(
        self, client: httpx.AsyncClient, configured: service.Witness, old: int, signed: bytes, text: bytes, size: int
    ) -> witness.Answer:
        """One add-checkpoint of ``signed`` (of ``size``, note text ``text``) from ``old``; what its answer means."""
        if old > size:
            return witness.Refused(
                f"it holds a tree of {old}, larger than this log's {size}: another log under this origin?"
            )
        proof = [] if old == 0 else (await service.consistency(self._store, old, size, self._log))[1]
        body = witness.add_checkpoint_body(old, proof, signed)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                async with client.stream("POST", f"{configured.url}/add-checkpoint", content=body) as response:
                    content = bytearray()
                    async for chunk in response.aiter_bytes():
                        content += chunk
                        if len(content) > MAX_ANSWER_BYTES:
                            return witness.Failed(f"its answer is larger than {MAX_ANSWER_BYTES} bytes")
        except TimeoutError:
            return witness.Failed(f"no whole answer within {REQUEST_TIMEOUT_S:g} s")
        except httpx.HTTPError as exc:
            return witness.Failed(f"cannot reach it ({type(exc).__name__})")
        return witness.read_answer(
            configured.key, text, response.status_code, response.headers.get("content-type", ""), bytes(content)
        )

    async def _record(self, state: _State, configured: service.Witness, answer: witness.Answer, size: int) -> None:
        name = configured.key.name
        if isinstance(answer, witness.Cosigned):
            async with self._store.transaction() as conn:
                line = answer.cosignature.line().decode().rstrip("\n")
                await self._log.cosignatures.add(conn, witness=configured.key.vkey(), tree_size=size, line=line)
            state.size = state.cosigned = size
            state.retry, state.next_at = 0.0, 0.0
            metrics.witness_cosigned_size.labels(self._log.name, name).set(size)
            self._change(state, configured, "ok", f"cosigns (tree size {size})")
            return
        metrics.witness_failures.labels(self._log.name, name).inc()
        if isinstance(answer, witness.Conflict):
            answer = witness.Refused(
                f"409 for tree size {state.size}: it holds another root for it (a split view?)", settings=False
            )
        if isinstance(answer, witness.Refused):
            state.retry = MAX_RETRY_S
            check = (
                f"check its url and vkey in transparency.witnesses[{state.index}], and that the witness knows "
                f"this log's origin and key" if answer.settings else "compare the log with what the witness holds"
            )
            self._change(state, configured, "refused", f"{answer.reason}; {check} (the {self._log.name} log)")
        else:
            state.retry = min(MAX_RETRY_S, max(FIRST_RETRY_S, state.retry * 2))
            self._change(state, configured, "failing", f"{answer.reason}; trying again with backoff (at most {MAX_RETRY_S:g} s)")
        state.next_at = time.monotonic() + state.retry

    def _change(self, state: _State, configured: service.Witness, status: str, reason: str) -> None:
        """One log line per change of a witness's state (a failure's reason changing is one)."""
        changed = status != state.status or (status in ("failing", "refused") and reason != state.reason)
        state.status, state.reason = status, reason
        if not changed:
            return
        level = logging.INFO if status in ("ok", "resync") else logging.WARNING
        logger.log(
            level, "witness %s (%s) for the %s: %s", configured.key.name, configured.url, self._log.name, reason,
            extra={"action": "witness_" + status, "witness": configured.key.name, "log": self._log.name},
        )
