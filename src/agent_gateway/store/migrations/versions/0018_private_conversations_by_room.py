"""channel_conversations: an index by (channel, conversation), so a group room's read scans no User's row

Every Matrix read that brings a group room's events takes that room off any User's
private conversation (store.queries.channels.forget_private): without an index that
statement read every User's row on the channel, once per read of a busy room.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01
"""

from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        'ix_channel_conversations_channel_conversation', 'channel_conversations', ['channel', 'conversation'],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index('ix_channel_conversations_channel_conversation', table_name='channel_conversations')
