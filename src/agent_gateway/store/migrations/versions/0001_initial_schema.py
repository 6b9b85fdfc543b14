"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-21
"""

from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('decisions',
    sa.Column('seq', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('statement', sa.Text(), nullable=False),
    sa.Column('jws', sa.Text(), nullable=False),
    sa.Column('created_at', sa.String(length=24), nullable=False),
    sa.PrimaryKeyConstraint('seq', name=op.f('pk_decisions')),
    sqlite_autoincrement=True
    )
    op.create_table('schedules',
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=8), nullable=False),
    sa.Column('at', sa.String(length=24), nullable=True),
    sa.Column('expr', sa.Text(), nullable=True),
    sa.Column('tz', sa.Text(), nullable=True),
    sa.Column('until', sa.String(length=24), nullable=True),
    sa.Column('data', sa.Text(), nullable=False),
    sa.Column('next_fire_at', sa.String(length=24), nullable=False),
    sa.Column('updated_at', sa.String(length=24), nullable=False),
    sa.CheckConstraint("kind IN ('once', 'cron')", name=op.f('ck_schedules_kind')),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_schedules'))
    )
    with op.batch_alter_table('schedules', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_schedules_next_fire_at_name'), ['next_fire_at', 'name'], unique=False)

    op.create_table('signals',
    sa.Column('position', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('payload', sa.Text(), nullable=False),
    sa.Column('emitted_at', sa.String(length=24), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.CheckConstraint("state IN ('pending', 'processing', 'done', 'failed')", name=op.f('ck_signals_state')),
    sa.PrimaryKeyConstraint('position', name=op.f('pk_signals')),
    sa.UniqueConstraint('id', name=op.f('uq_signals_id')),
    sqlite_autoincrement=True
    )
    with op.batch_alter_table('signals', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_signals_emitted_at_position'), ['emitted_at', 'position'], unique=False)
        batch_op.create_index(batch_op.f('ix_signals_kind_emitted_at_position'), ['kind', 'emitted_at', 'position'], unique=False)
        batch_op.create_index(batch_op.f('ix_signals_state_emitted_at_position'), ['state', 'emitted_at', 'position'], unique=False)

    op.create_table('users',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('attributes', sa.Text(), nullable=False),
    sa.Column('created_at', sa.String(length=24), nullable=False),
    sa.Column('password_digest', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_users'))
    )
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_users_created_at_id'), ['created_at', 'id'], unique=False)

    op.create_table('messages',
    sa.Column('user_id', sa.String(length=36), nullable=False),
    sa.Column('seq', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('direction', sa.String(length=8), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('created_at', sa.String(length=24), nullable=False),
    sa.CheckConstraint("direction IN ('inbound', 'outbound')", name=op.f('ck_messages_direction')),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_messages_user_id_users')),
    sa.PrimaryKeyConstraint('user_id', 'seq', name=op.f('pk_messages')),
    sa.UniqueConstraint('id', name=op.f('uq_messages_id'))
    )
    op.create_table('runs',
    sa.Column('position', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('signal_id', sa.String(length=36), nullable=False),
    sa.Column('session', sa.Text(), nullable=True),
    sa.Column('prompt', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('started_at', sa.String(length=24), nullable=True),
    sa.Column('ended_at', sa.String(length=24), nullable=True),
    sa.CheckConstraint("state IN ('pending', 'running', 'done', 'failed')", name=op.f('ck_runs_state')),
    sa.ForeignKeyConstraint(['signal_id'], ['signals.id'], name=op.f('fk_runs_signal_id_signals')),
    sa.PrimaryKeyConstraint('position', name=op.f('pk_runs')),
    sa.UniqueConstraint('id', name=op.f('uq_runs_id')),
    sqlite_autoincrement=True
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_signal_id'), ['signal_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_started_at_position'), ['started_at', 'position'], unique=False)

    op.create_table('tokens',
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('user_id', sa.String(length=36), nullable=False),
    sa.Column('created_at', sa.String(length=24), nullable=False),
    sa.Column('expires_at', sa.String(length=24), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_tokens_user_id_users')),
    sa.PrimaryKeyConstraint('digest', name=op.f('pk_tokens'))
    )
    with op.batch_alter_table('tokens', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tokens_user_id'), ['user_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('tokens', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tokens_user_id'))

    op.drop_table('tokens')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_started_at_position'))
        batch_op.drop_index(batch_op.f('ix_runs_signal_id'))

    op.drop_table('runs')
    op.drop_table('messages')
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_users_created_at_id'))

    op.drop_table('users')
    with op.batch_alter_table('signals', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_signals_state_emitted_at_position'))
        batch_op.drop_index(batch_op.f('ix_signals_kind_emitted_at_position'))
        batch_op.drop_index(batch_op.f('ix_signals_emitted_at_position'))

    op.drop_table('signals')
    with op.batch_alter_table('schedules', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_schedules_next_fire_at_name'))

    op.drop_table('schedules')
    op.drop_table('decisions')
