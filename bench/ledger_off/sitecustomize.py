"""The gateway without the Run ledger's Run entries, for ``bench.ledger``'s comparison only.

Put on ``PYTHONPATH`` before ``src``, Python imports this at every start of a gateway process:
the Signal Worker then starts each Run exactly as with the ledger, in the same transaction or
statement, with the same code and schema, but appends no entry (``Ledger.started`` writes only
the Runs it is given to record, in the statement of their own they take where there is no
entry; ``Ledger.claimed_ahead``, on PostgreSQL, claims the Signal read ahead, records its Runs
and ends what it is given in one statement alone, as with the ledger, without the draw and the
entry). No setting turns the ledger off: an operator who could would defeat it.
"""

import sqlalchemy as sa

from agent_gateway.ledger import service
from agent_gateway.store import direct
from agent_gateway.store.queries import runs as run_queries
from agent_gateway.store.queries import signals as signal_queries


async def _no_entry(self, conn, signal, runs, started_at, record=()):  # type: ignore[no-untyped-def]
    await run_queries.insert(conn, record)


def _claiming(ending: bool) -> direct.Query:
    claimed = signal_queries.claiming(sa.true())
    recorded = sa.text(f"{run_queries.POSTGRES_INSERT} WHERE EXISTS (SELECT FROM claimed)").columns().cte("recorded")
    ends = signal_queries.ended() if ending else ()
    return direct.Query(signal_queries.with_next(claimed).add_cte(*ends, claimed, recorded))


_CLAIMING = {ending: _claiming(ending) for ending in (False, True)}


async def _claimed_ahead_without_entry(self, conn, queued, record, started_at, ending=None):  # type: ignore[no-untyped-def]
    [row] = await direct.run(
        conn, _CLAIMING[ending is not None], **run_queries.postgres_columns(record), **queued.claim_params(),
        **(ending or {}),
    )
    return signal_queries.claimed_and_next(row)


service.Ledger.started = _no_entry  # type: ignore[method-assign]
service.Ledger.claimed_ahead = _claimed_ahead_without_entry  # type: ignore[method-assign]
