"""nostr: ids of NIP-98 events accepted within the replay window

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'nostr_auth_events',
        sa.Column('event_id', sa.String(length=64), nullable=False),
        sa.Column('expires_at', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('event_id', name=op.f('pk_nostr_auth_events')),
    )
    op.create_index(op.f('ix_nostr_auth_events_expires_at'), 'nostr_auth_events', ['expires_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_nostr_auth_events_expires_at'), table_name='nostr_auth_events')
    op.drop_table('nostr_auth_events')
