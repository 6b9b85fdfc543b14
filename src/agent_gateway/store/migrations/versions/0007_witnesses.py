"""witness cosignatures of the Decision log's checkpoints

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28
"""

from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('witness_cosignatures',
    sa.Column('witness', sa.Text(), nullable=False),
    sa.Column('tree_size', sa.BigInteger(), nullable=False),
    sa.Column('line', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('witness', 'tree_size', name=op.f('pk_witness_cosignatures'))
    )


def downgrade() -> None:
    op.drop_table('witness_cosignatures')
