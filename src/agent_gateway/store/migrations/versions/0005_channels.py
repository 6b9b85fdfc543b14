"""chat channels: identities, pairing requests, conversations, read positions, the channel outbox

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28
"""

from alembic import op
import sqlalchemy as sa

from agent_gateway.store.migrations.outbox_columns import outbox_columns


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('channel_identities',
    sa.Column('identity', sa.Text(), nullable=False),
    sa.Column('channel', sa.String(length=32), nullable=False),
    sa.Column('user_id', sa.String(length=36), nullable=False),
    sa.Column('created_at', sa.String(length=24), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_channel_identities_user_id_users')),
    sa.PrimaryKeyConstraint('identity', name=op.f('pk_channel_identities'))
    )
    op.create_index(op.f('ix_channel_identities_user_id'), 'channel_identities', ['user_id'], unique=False)
    op.create_table('channel_pairings',
    sa.Column('code', sa.String(length=8), nullable=False),
    sa.Column('channel', sa.String(length=32), nullable=False),
    sa.Column('identity', sa.Text(), nullable=False),
    sa.Column('created_at', sa.String(length=24), nullable=False),
    sa.Column('expires_at', sa.String(length=24), nullable=False),
    sa.PrimaryKeyConstraint('code', name=op.f('pk_channel_pairings')),
    sa.UniqueConstraint('identity', name=op.f('uq_channel_pairings_identity'))
    )
    op.create_index(op.f('ix_channel_pairings_channel_expires_at'), 'channel_pairings', ['channel', 'expires_at'], unique=False)
    op.create_table('channel_conversations',
    sa.Column('user_id', sa.String(length=36), nullable=False),
    sa.Column('channel', sa.String(length=32), nullable=False),
    sa.Column('identity', sa.Text(), nullable=False),
    sa.Column('conversation', sa.Text(), nullable=False),
    sa.Column('inbound_seq', sa.BigInteger(), nullable=True),
    sa.Column('updated_at', sa.String(length=24), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_channel_conversations_user_id_users')),
    sa.PrimaryKeyConstraint('user_id', name=op.f('pk_channel_conversations'))
    )
    op.create_table('channel_positions',
    sa.Column('channel', sa.String(length=32), nullable=False),
    sa.Column('position', sa.Text(), nullable=False),
    sa.Column('updated_at', sa.String(length=24), nullable=False),
    sa.PrimaryKeyConstraint('channel', name=op.f('pk_channel_positions'))
    )
    op.create_table('channel_deliveries',
    sa.Column('position', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('channel', sa.String(length=32), nullable=False),
    sa.Column('identity', sa.Text(), nullable=False),
    sa.Column('conversation', sa.Text(), nullable=True),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('user_id', sa.String(length=36), nullable=True),
    sa.Column('message_id', sa.String(length=36), nullable=True),
    sa.Column('text', sa.Text(), nullable=False),
    *outbox_columns(),
    sa.CheckConstraint("state IN ('pending', 'failed', 'delivered', 'dead')", name=op.f('ck_channel_deliveries_state')),
    sa.CheckConstraint("kind IN ('message', 'notice')", name=op.f('ck_channel_deliveries_kind')),
    sa.PrimaryKeyConstraint('position', name=op.f('pk_channel_deliveries')),
    sqlite_autoincrement=True
    )
    op.create_index(op.f('ix_channel_deliveries_state_next_attempt_at'), 'channel_deliveries', ['state', 'next_attempt_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_channel_deliveries_state_next_attempt_at'), table_name='channel_deliveries')
    op.drop_table('channel_deliveries')
    op.drop_table('channel_positions')
    op.drop_table('channel_conversations')
    op.drop_index(op.f('ix_channel_pairings_channel_expires_at'), table_name='channel_pairings')
    op.drop_table('channel_pairings')
    op.drop_index(op.f('ix_channel_identities_user_id'), table_name='channel_identities')
    op.drop_table('channel_identities')
