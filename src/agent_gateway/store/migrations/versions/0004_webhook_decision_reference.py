"""a delivery of a Decision refers to it; a delivery's id has no index of its own

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27

A delivery's body may be NULL, with the seq of the Decision it reports: the
deliverer composes the body from that Decision at each attempt. Deliveries
already written keep their bodies. The id's unique index goes: every write of
an outbox row paid for it, and its lookups go through the state index instead
(see store.queries.webhooks).
"""

from alembic import op
import sqlalchemy as sa

from agent_gateway import jsontext


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


_ONE_OF = '(body IS NULL) <> (decision_seq IS NULL)'
# SQLite alters a column by copying the table, made from what it reflects, which does not
# show AUTOINCREMENT.
_SQLITE_AUTOINCREMENT = {'sqlite_autoincrement': True}


def upgrade() -> None:
    with op.batch_alter_table('webhook_deliveries', table_kwargs=_SQLITE_AUTOINCREMENT) as batch:
        batch.add_column(sa.Column('decision_seq', sa.BigInteger(), nullable=True))
        batch.alter_column('body', existing_type=sa.Text(), nullable=True)
        batch.create_check_constraint(op.f('ck_webhook_deliveries_body'), _ONE_OF)
        batch.drop_constraint(op.f('uq_webhook_deliveries_id'), type_='unique')


def downgrade() -> None:
    # A delivery that refers to its Decision gets the copy revision 0003 would have written:
    # the body of webhooks.outbox and the record of the Decision, frozen here as they were then.
    bind = op.get_bind()
    deliveries = sa.table('webhook_deliveries', sa.column('position'), sa.column('body'), sa.column('decision_seq'))
    decisions = sa.table('decisions', sa.column('seq'), sa.column('statement'), sa.column('jws'), sa.column('created_at'))
    referring = bind.execute(
        sa.select(deliveries.c.position, decisions.c.seq, decisions.c.statement, decisions.c.jws, decisions.c.created_at)
        .join(decisions, decisions.c.seq == deliveries.c.decision_seq)
    ).all()
    for position, seq, statement, jws, created_at in referring:
        record = {'seq': seq, 'statement': jsontext.loads(statement), 'jws': jws, 'createdAt': created_at}
        text = jsontext.dumps({'type': 'decision.published', 'timestamp': created_at, 'data': record}).decode()
        bind.execute(deliveries.update().where(deliveries.c.position == position).values(body=text, decision_seq=None))
    with op.batch_alter_table('webhook_deliveries', table_kwargs=_SQLITE_AUTOINCREMENT) as batch:
        batch.drop_constraint(op.f('ck_webhook_deliveries_body'), type_='check')
        batch.alter_column('body', existing_type=sa.Text(), nullable=False)
        batch.drop_column('decision_seq')
        batch.create_unique_constraint(op.f('uq_webhook_deliveries_id'), ['id'])
