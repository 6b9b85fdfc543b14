"""nostr_auth_events keyed by (created_at, event_id), in time order, without a rowid

An event's id covers its created_at, so the pair is unique exactly when the id
is; in that order new ids are written at the end of the key instead of at
random places (one page or two per batch, not a page per id), and expired ids
are a range at its start, with no index of their own. The ids remembered
before the upgrade are dropped (they had no created_at): see the security page.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

from agent_gateway.store.migrations import first_replay_table

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    first_replay_table.drop()
    op.create_table(
        'nostr_auth_events',
        sa.Column('created_at', sa.BigInteger(), nullable=False),
        sa.Column('event_id', sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint('created_at', 'event_id', name=op.f('pk_nostr_auth_events')),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table('nostr_auth_events')
    first_replay_table.create()
