"""nostr: ids of NIP-98 events accepted within the replay window

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from agent_gateway.store.migrations import first_replay_table

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    first_replay_table.create()


def downgrade() -> None:
    first_replay_table.drop()
