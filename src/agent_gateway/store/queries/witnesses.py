"""Queries on the witnesses' cosignatures: one row per witness and tree size it cosigned."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_gateway.store.tables import witness_cosignatures as cosignatures


@dataclasses.dataclass(frozen=True)
class Witnessed:
    """The largest tree size cosigned by enough witnesses, and their lines (by verifier key)."""

    tree_size: int
    lines: dict[str, str]


async def add(conn: AsyncConnection, *, witness: str, tree_size: int, line: str) -> None:
    """Keep ``witness``'s cosignature of ``tree_size``; a second one of the same size is left out
    (two processes that led in turn may both have collected it)."""
    insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(cosignatures)
    await conn.execute(
        insert.values(witness=witness, tree_size=tree_size, line=line).on_conflict_do_nothing(
            index_elements=["witness", "tree_size"]
        )
    )


async def last_sizes(conn: AsyncConnection, witnesses: Sequence[str]) -> dict[str, int]:
    """The largest size each of ``witnesses`` cosigned (those that cosigned any)."""
    rows = await conn.execute(
        sa.select(cosignatures.c.witness, sa.func.max(cosignatures.c.tree_size))
        .where(cosignatures.c.witness.in_(list(witnesses)))
        .group_by(cosignatures.c.witness)
    )
    return {witness: size for witness, size in rows}


async def witnessed(conn: AsyncConnection, witnesses: Sequence[str], quorum: int) -> Witnessed | None:
    """The largest tree size that at least ``quorum`` of ``witnesses`` cosigned, or None."""
    size = (
        await conn.execute(
            sa.select(cosignatures.c.tree_size)
            .where(cosignatures.c.witness.in_(list(witnesses)))
            .group_by(cosignatures.c.tree_size)
            .having(sa.func.count() >= quorum)
            .order_by(cosignatures.c.tree_size.desc())
            .limit(1)
        )
    ).scalar()
    if size is None:
        return None
    rows = await conn.execute(
        sa.select(cosignatures.c.witness, cosignatures.c.line).where(
            cosignatures.c.tree_size == size, cosignatures.c.witness.in_(list(witnesses))
        )
    )
    return Witnessed(size, {witness: line for witness, line in rows})
