"""channel_conversations.conversation nullable: a direct room found shared leaves one to open

A read that finds a User's direct room shared (someone invited to it) deleted their private
conversation, and with it the knowledge that their most recent inbound Message came by that
channel: until they wrote again, none of their outbound Messages went to any channel. The row
now stays with its conversation NULL, and the next delivery opens a new one (channels.sender).
A process of the version before, during a rolling restart, still deletes the row as before;
one that reads a row without a conversation fails that delivery's attempt, which is retried
(the new version sends it).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('channel_conversations') as batch:
        batch.alter_column('conversation', existing_type=sa.Text(), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM channel_conversations WHERE conversation IS NULL")
    with op.batch_alter_table('channel_conversations') as batch:
        batch.alter_column('conversation', existing_type=sa.Text(), nullable=False)
