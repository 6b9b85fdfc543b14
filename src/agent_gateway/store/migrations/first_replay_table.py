"""The table of NIP-98 event ids as migration 0008 created it (keyed by the id, with an index of
expiry times): 0008's upgrade and 0013's downgrade create it, 0008's downgrade and 0013's upgrade
drop it.

Part of those migrations' history: never change it; a later change of the table is a migration of
its own.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


def create() -> None:
    op.create_table(
        'nostr_auth_events',
        sa.Column('event_id', sa.String(length=64), nullable=False),
        sa.Column('expires_at', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('event_id', name=op.f('pk_nostr_auth_events')),
    )
    op.create_index(op.f('ix_nostr_auth_events_expires_at'), 'nostr_auth_events', ['expires_at'], unique=False)


def drop() -> None:
    op.drop_index(op.f('ix_nostr_auth_events_expires_at'), table_name='nostr_auth_events')
    op.drop_table('nostr_auth_events')
