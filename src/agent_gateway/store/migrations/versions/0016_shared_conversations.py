"""channel_shared_conversations: a User's group room, kept apart from their private conversation

An answer to a Message written in a group room went back there, and so did every later
outbound Message of that User (a Schedule's reminder, the answer to a question asked
privately just before): the room of their most recent inbound Message was the only one
remembered. A Message written in a shared conversation now records it here, and only the
answers to that Message go there (channels.outbox.target); channel_conversations keeps the
private one. Rows already there stay as they are; a process of the version before, during a
rolling restart, writes a group room there as it always did.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('channel_shared_conversations',
    sa.Column('user_id', sa.String(length=36), nullable=False),
    sa.Column('channel', sa.String(length=32), nullable=False),
    sa.Column('identity', sa.Text(), nullable=False),
    sa.Column('conversation', sa.Text(), nullable=False),
    sa.Column('inbound_seq', sa.BigInteger(), nullable=True),
    sa.Column('updated_at', sa.String(length=24), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_channel_shared_conversations_user_id_users')),
    sa.PrimaryKeyConstraint('user_id', name=op.f('pk_channel_shared_conversations'))
    )


def downgrade() -> None:
    op.drop_table('channel_shared_conversations')
