"""The gateway without the Run ledger's Run entries, for ``bench.ledger``'s comparison only.

Put on ``PYTHONPATH`` before ``src``, Python imports this at every start of a gateway process:
the Signal Worker then starts each Run exactly as with the ledger, in the same transaction, with
the same code and schema, but appends no entry (``Ledger.started`` writes only the Runs it is given
to record, in the statement of their own they take where there is no entry). No setting
turns the ledger off: an operator who could would defeat it.
"""

from agent_gateway.ledger import service
from agent_gateway.store.queries import runs as run_queries


async def _no_entry(self, conn, signal, runs, started_at, record=()):  # type: ignore[no-untyped-def]
    await run_queries.insert(conn, record)


service.Ledger.started = _no_entry  # type: ignore[method-assign]
