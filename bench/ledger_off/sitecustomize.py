"""The gateway without the Run ledger's Run entries, for ``bench.ledger``'s comparison only.

Put on ``PYTHONPATH`` before ``src``, Python imports this at every start of a gateway process:
the Signal Worker then starts each Run exactly as with the ledger, in the same transaction, with
the same code and schema, but appends no entry (``Ledger.started`` does nothing). No setting
turns the ledger off: an operator who could would defeat it.
"""

from agent_gateway.ledger import service


async def _no_entry(self, conn, signal, runs, started_at):  # type: ignore[no-untyped-def]
    return None


service.Ledger.started = _no_entry  # type: ignore[method-assign]
