"""the Run ledger: its entries and its Merkle tree

Revision ID: 0011
Revises: 0008
Create Date: 2026-11-28
"""

from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0008'
branch_labels = None
depends_on = None

_SERIAL = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table('ledger_entries',
    sa.Column('seq', _SERIAL, autoincrement=False, nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('leaf', sa.Text(), nullable=False),
    sa.Column('run_id', sa.String(length=36), nullable=True),
    sa.CheckConstraint("kind IN ('instructions', 'run')", name=op.f('ck_ledger_entries_kind')),
    sa.PrimaryKeyConstraint('seq', name=op.f('pk_ledger_entries')),
    sa.UniqueConstraint('run_id', name=op.f('uq_ledger_entries_run_id'))
    )
    op.create_index(op.f('ix_ledger_entries_kind_seq'), 'ledger_entries', ['kind', 'seq'], unique=False)
    if op.get_bind().dialect.name == 'postgresql':
        # Drawn with the ledger's lock (store.queries.ledger): tells a writer whether another wrote since.
        op.execute(sa.schema.CreateSequence(sa.Sequence('ledger_draws')))
    op.create_table('ledger_tree',
    sa.Column('node', _SERIAL, autoincrement=False, nullable=False),
    sa.Column('hash', sa.LargeBinary(length=32), nullable=False),
    sa.PrimaryKeyConstraint('node', name=op.f('pk_ledger_tree'))
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(sa.schema.DropSequence(sa.Sequence('ledger_draws')))
    op.drop_table('ledger_tree')
    op.drop_index(op.f('ix_ledger_entries_kind_seq'), table_name='ledger_entries')
    op.drop_table('ledger_entries')
