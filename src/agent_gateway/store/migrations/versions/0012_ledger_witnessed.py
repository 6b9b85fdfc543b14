"""the Run ledger witnessed: its cosignatures, and where each Signal came from

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('ledger_witness_cosignatures',
    sa.Column('witness', sa.Text(), nullable=False),
    sa.Column('tree_size', sa.BigInteger(), nullable=False),
    sa.Column('line', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('witness', 'tree_size', name=op.f('pk_ledger_witness_cosignatures'))
    )
    with op.batch_alter_table('signals') as batch:
        batch.add_column(sa.Column('origin', sa.String(length=16), server_default='operator', nullable=False))
    # The Signals written before: their kind tells what emitted them, as far as it can.
    op.execute(
        "UPDATE signals SET origin = CASE kind WHEN 'message.received' THEN 'message' "
        "WHEN 'service_schedule_fired' THEN 'schedule' ELSE 'operator' END"
    )


def downgrade() -> None:
    with op.batch_alter_table('signals') as batch:
        batch.drop_column('origin')
    op.drop_table('ledger_witness_cosignatures')
