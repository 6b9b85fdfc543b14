"""the Merkle tree over the Decision log

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

Adds each Decision's leaf index and the hashes of the tree's complete
subtrees, and builds the tree for the Decisions already there, in seq order.
"""

from alembic import op
import sqlalchemy as sa

from agent_gateway import merkle


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

# Decisions read, hashed and written per round while the tree is built.
_CHUNK = 10_000
_LEVEL_BITS = 6  # store.queries.tree.key, frozen here as this revision writes it


def upgrade() -> None:
    op.add_column('decisions', sa.Column('leaf_index', sa.BigInteger(), nullable=True))
    op.create_table('decision_tree',
    sa.Column('node', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=False, nullable=False),
    sa.Column('hash', sa.LargeBinary(length=32), nullable=False),
    sa.PrimaryKeyConstraint('node', name=op.f('pk_decision_tree'))
    )
    _build_tree(op.get_bind())


def _build_tree(bind: sa.Connection) -> None:
    decisions = sa.table('decisions', sa.column('seq'), sa.column('jws'), sa.column('leaf_index'))
    nodes = sa.table('decision_tree', sa.column('node'), sa.column('hash'))
    set_leaf = (
        decisions.update().where(decisions.c.seq == sa.bindparam('number')).values(leaf_index=sa.bindparam('leaf'))
    )
    size, after = 0, 0
    frontier: list[bytes] = []
    while True:
        rows = bind.execute(
            sa.select(decisions.c.seq, decisions.c.jws).where(decisions.c.seq > after).order_by(decisions.c.seq).limit(_CHUNK)
        ).all()
        if not rows:
            return
        completed, frontier = merkle.appended(frontier, size, [merkle.leaf_hash(jws.encode()) for _, jws in rows])
        bind.execute(set_leaf, [{'number': seq, 'leaf': size + offset} for offset, (seq, _) in enumerate(rows)])
        bind.execute(nodes.insert(), [{'node': _key(level, index), 'hash': hash_} for (level, index), hash_ in completed])
        size += len(rows)
        after = rows[-1][0]


def _key(level: int, index: int) -> int:
    """The node's key: the last leaf it covers, then its level."""
    return (((index + 1) << level) - 1) << _LEVEL_BITS | level


def downgrade() -> None:
    op.drop_table('decision_tree')
    # Not in batch mode: rebuilding the table on SQLite would lose its AUTOINCREMENT.
    op.drop_column('decisions', 'leaf_index')
