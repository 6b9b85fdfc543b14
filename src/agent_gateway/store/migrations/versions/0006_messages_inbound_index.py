"""messages: a partial index of inbound Messages by User and seq (a channel route's last inbound Message)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28
"""

from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

INBOUND_ONLY = sa.text("direction = 'inbound'")


def upgrade() -> None:
    op.create_index(
        'ix_messages_inbound', 'messages', ['user_id', 'seq'], unique=False,
        sqlite_where=INBOUND_ONLY, postgresql_where=INBOUND_ONLY,
    )


def downgrade() -> None:
    op.drop_index('ix_messages_inbound', table_name='messages')
