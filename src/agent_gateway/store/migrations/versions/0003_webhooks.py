"""the webhook outbox

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25

One row per webhook delivery, written with the event it reports.
"""

from alembic import op
import sqlalchemy as sa

from agent_gateway.store.migrations.outbox_columns import outbox_columns


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('webhook_deliveries',
    sa.Column('position', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('event', sa.String(length=32), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    *outbox_columns(),
    sa.CheckConstraint("state IN ('pending', 'failed', 'delivered', 'dead')", name=op.f('ck_webhook_deliveries_state')),
    sa.PrimaryKeyConstraint('position', name=op.f('pk_webhook_deliveries')),
    sa.UniqueConstraint('id', name=op.f('uq_webhook_deliveries_id')),
    sqlite_autoincrement=True
    )
    op.create_index(op.f('ix_webhook_deliveries_state_next_attempt_at'), 'webhook_deliveries', ['state', 'next_attempt_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_webhook_deliveries_state_next_attempt_at'), table_name='webhook_deliveries')
    op.drop_table('webhook_deliveries')
