"""ledger_entries: the instructions entries' index is partial, so a Run's entry writes no entry in it

The index by (kind, seq) served one query, the newest instructions entry
(store.queries.ledger.last_instructions), and took an entry from every Run's
start besides: one more index page in each Run's commit. The partial index of
the instructions entries by seq answers that query as well, and a Run's entry
is not in it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

INSTRUCTIONS_ONLY = sa.text("kind = 'instructions'")


def upgrade() -> None:
    op.create_index(
        'ix_ledger_entries_instructions', 'ledger_entries', ['seq'], unique=False,
        sqlite_where=INSTRUCTIONS_ONLY, postgresql_where=INSTRUCTIONS_ONLY,
    )
    op.drop_index('ix_ledger_entries_kind_seq', table_name='ledger_entries')


def downgrade() -> None:
    op.create_index('ix_ledger_entries_kind_seq', 'ledger_entries', ['kind', 'seq'], unique=False)
    op.drop_index('ix_ledger_entries_instructions', table_name='ledger_entries')
