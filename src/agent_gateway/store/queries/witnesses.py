"""Queries on the witnesses' cosignatures of a log's checkpoints (the Decision log's, the Run
ledger's): one table per log, one row per witness and tree size it cosigned, the same code for
each (:class:`Cosignatures`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway.store import tables


@dataclasses.dataclass(frozen=True)
class Witnessed:
    """The largest tree size cosigned by enough witnesses, and their lines (by verifier key)."""

    tree_size: int
    lines: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Cosignatures:
    """The cosignatures of one log's checkpoints, in ``table`` (witness, tree_size, line)."""

    table: sa.Table

    async def add(self, conn: AsyncConnection, *, witness: str, tree_size: int, line: str) -> None:
        """Keep ``witness``'s cosignature of ``tree_size``; a second one of the same size is left out
        (two processes that led in turn may both have collected it)."""
        insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(self.table)
        await conn.execute(
            insert.values(witness=witness, tree_size=tree_size, line=line).on_conflict_do_nothing(
                index_elements=["witness", "tree_size"]
            )
        )

    async def last_sizes(self, conn: AsyncConnection, witnesses: Sequence[str]) -> dict[str, int]:
        """The largest size each of ``witnesses`` cosigned (those that cosigned any)."""
        c = self.table.c
        rows = await conn.execute(
            sa.select(c.witness, sa.func.max(c.tree_size)).where(c.witness.in_(list(witnesses))).group_by(c.witness)
        )
        return {witness: size for witness, size in rows}

    async def witnessed(self, conn: AsyncConnection, witnesses: Sequence[str], quorum: int) -> Witnessed | None:
        """The largest tree size that at least ``quorum`` of ``witnesses`` cosigned, or None."""
        c = self.table.c
        size = (
            await conn.execute(
                sa.select(c.tree_size)
                .where(c.witness.in_(list(witnesses)))
                .group_by(c.tree_size)
                .having(sa.func.count() >= quorum)
                .order_by(c.tree_size.desc())
                .limit(1)
            )
        ).scalar()
        if size is None:
            return None
        rows = await conn.execute(
            sa.select(c.witness, c.line).where(c.tree_size == size, c.witness.in_(list(witnesses)))
        )
        return Witnessed(size, {witness: line for witness, line in rows})


DECISIONS = Cosignatures(tables.witness_cosignatures)
LEDGER = Cosignatures(tables.ledger_witness_cosignatures)
