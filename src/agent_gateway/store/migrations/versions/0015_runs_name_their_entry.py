"""runs name their ledger entry (entry_seq); ledger_entries.run_id loses its unique index

A Run's entry was found by the Run's id, through a unique index on ledger_entries.run_id:
one more index entry, and a page of that index, in every Run's commit (3-4 % of the Runs per
second in bench.ledger). A Run now names its entry's number, written with the Run in the same
statement or transaction; a receipt finds its entries through the Runs of its Signal, then the
entries' primary key. A Run has one entry_seq, and an entry is appended only as its Run starts
(inserted running, or moved from pending in the same transaction), so no Run has two entries.

run_id stays, unindexed, for processes of the version before still running during a rolling
restart: they write it (and no entry_seq), and a receipt finds their Runs' entries by it
(store.queries.ledger.of_signal). A later revision drops it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('runs', sa.Column('entry_seq', sa.BigInteger(), nullable=True))
    op.execute(
        "UPDATE runs SET entry_seq = (SELECT seq FROM ledger_entries WHERE ledger_entries.run_id = runs.id) "
        "WHERE id IN (SELECT run_id FROM ledger_entries WHERE run_id IS NOT NULL)"
    )
    # SQLite drops a constraint only by copying the table (batch).
    with op.batch_alter_table('ledger_entries') as batch:
        batch.drop_constraint('uq_ledger_entries_run_id', type_='unique')


def downgrade() -> None:
    op.execute(
        "UPDATE ledger_entries SET run_id = (SELECT id FROM runs WHERE runs.entry_seq = ledger_entries.seq) "
        "WHERE seq IN (SELECT entry_seq FROM runs WHERE entry_seq IS NOT NULL)"
    )
    with op.batch_alter_table('ledger_entries') as batch:
        batch.create_unique_constraint('uq_ledger_entries_run_id', ['run_id'])
    op.drop_column('runs', 'entry_seq')
