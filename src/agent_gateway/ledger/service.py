"""Writing the Run ledger: the instructions at start, each Run's entry in the transaction that
starts it (so the ledger and the Runs never disagree), and reading its entries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway import clock, errors
from agent_gateway.ledger import entries
from agent_gateway.store import direct
from agent_gateway.store import window as windows
from agent_gateway.store.engine import Store
from agent_gateway.store.queries import ledger as queries
from agent_gateway.store.queries import runs as run_queries
from agent_gateway.store.queries import signals as signal_queries
from agent_gateway.store.queries import witnesses as witness_queries
from agent_gateway.store.queries.runs import Run
from agent_gateway.store.queries.signals import Signal
from agent_gateway.transparency import service as transparency

class EntryNotFound(errors.NotFound):
    """No ledger entry has this number."""


# The ledger as the transparency service proves it (checkpoints, inclusion, consistency).
LOG = transparency.Log(queries.TREE, "entry", EntryNotFound, witness_queries.LEDGER, queries.CHANNEL, "ledger")


class Ledger:
    """One process's writer of the ledger: the instructions it runs under, then its Runs."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # The number of the instructions entry in force, once :meth:`record_instructions` ran.
        self.instructions_seq: int | None = None

    async def record_instructions(self, instructions: dict[str, Any]) -> int:
        """Append an instructions entry unless the newest one holds these ``instructions``; the
        number of the entry in force. Under the ledger's lock, so two processes starting at once
        with the same instructions write one entry."""
        wanted = entries.canonical(instructions)
        async with self.store.transaction() as conn:
            await queries.lock(conn)
            last = await queries.last_instructions(conn)
            if last is not None and entries.canonical(orjson.loads(last.leaf)["instructions"]) == wanted:
                seq = last.seq
            else:
                leaf = entries.instructions(instructions, clock.now_iso())
                [seq] = await queries.append(conn, [queries.New(entries.INSTRUCTIONS, leaf)])
        self.instructions_seq = seq
        await self.integrate()
        return seq

    async def integrate(self) -> None:
        """Grow the ledger's tree to every committed entry (``tree.Tree.integrate``): the Signal
        Worker does so whenever it finds the queue empty, and every reader of the tree first."""
        await queries.TREE.integrate(self.store)

    async def started(
        self, conn: AsyncConnection, signal: Signal, runs: Sequence[Run], started_at: str, record: Sequence[Run] = ()
    ) -> None:
        """Append the entries of ``runs`` of ``signal``, started at ``started_at`` in ``conn``'s transaction.

        ``record``: Runs of ``signal`` not yet written (``run_queries.to_record``), written with the
        entries (on PostgreSQL in their statement, a round trip less)."""
        if not runs:
            await run_queries.insert(conn, record)
            return
        await queries.append(conn, [self._entry(signal, run, started_at) for run in runs], record)

    async def claimed_ahead(
        self, conn: direct.Alone, queued: signal_queries.Queued, record: Sequence[Run], started_at: str,
        ending: Mapping[str, object] | None = None,
    ) -> tuple[bool, signal_queries.Queued | None]:
        """On PostgreSQL, alone: claim ``queued`` if it is still the oldest pending Signal, record its
        Runs ``record`` with the first started at ``started_at`` and append that one's entry, in one
        statement (``store.queries.ledger.claim_ahead``, which also ends what ``ending`` names):
        whether it claimed, and the Signal next as the statement saw it."""
        entry = self._entry(queued.signal, record[0], started_at)
        return await queries.claim_ahead(conn, queued, entry, record, ending)

    def _entry(self, signal: Signal, run: Run, started_at: str) -> queries.New:
        if self.instructions_seq is None:
            raise RuntimeError("the ledger records Runs once the instructions are recorded")
        return queries.New(
            entries.RUN,
            entries.run(
                run_id=run.id, signal_id=signal.id, kind=signal.kind, origin=signal.origin, session=run.session,
                prompt=run.prompt, payload=signal.payload, instructions_seq=self.instructions_seq,
                started_at=started_at,
            ),
            run.id,
        )


async def read(store: Store, window: windows.Window) -> list[queries.Entry]:
    return await queries.window(store, window=window)


async def get(store: Store, seq: int) -> queries.Entry:
    """Entry ``seq``; raises :class:`EntryNotFound`."""
    entry = await queries.get(store, seq=seq)
    if entry is None:
        raise EntryNotFound()
    return entry
