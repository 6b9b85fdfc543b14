"""notification_listeners: on PostgreSQL, a NOTIFY only when another process listens

Every PostgreSQL transaction that sends a NOTIFY takes the database's one notification lock
at commit and holds it until its commit is durable: notifying commits never share a disk
flush. A deployment of one process (the usual) sends its NOTIFY to nobody: its own
subscribers are woken at commit (store.notifications). Each listening process now registers
its listening connection here, and the functions below send a statement's notifications only
when a process other than the sender's listens.

agent_gateway_listen(origin) registers; agent_gateway_notify(channel, payloads) sends. They
share an advisory lock, so no wake-up is lost between them: a notifier takes it shared, then
reads the table with a snapshot of its own (a VOLATILE function's statements each take
one); a process registering takes it exclusively, which waits for the notifiers that read
the table before it and did not see the row, and sweeps once it has committed, when their
writes are committed too. A lock_timeout bounds the wait (store.notifications): a notifier
holding the lock shared may wait for a row another notifier holds, which waits behind the
exclusive request.

A row outlives its connection when the process dies: the listeners of the others prune the
rows of connections that are gone (pg_stat_activity). The table exists on SQLite too (one
schema), where nothing writes it. Processes of the version before, during a rolling restart,
do not register: until they stop, the new processes' writes reach their loops by the sweeps,
and their Message streams with the next wake-up (docs/operate/upgrading.md).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None

# The advisory lock the two functions share ('agnotify' in ASCII: no other lock of the gateway's).
_LOCK = 0x61676E6F74696679

_LISTEN = f"""
CREATE FUNCTION agent_gateway_listen(origin text) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({_LOCK});
    DELETE FROM notification_listeners WHERE pid NOT IN (SELECT pid FROM pg_stat_activity);
    INSERT INTO notification_listeners (pid, origin) VALUES (pg_backend_pid(), origin)
        ON CONFLICT (pid) DO UPDATE SET origin = EXCLUDED.origin;
END $$
"""

# A payload is '<origin> <channel>' (store.notifications.pg_payload), the sender's origin in each.
_NOTIFY = f"""
CREATE FUNCTION agent_gateway_notify(channel text, payloads text[]) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF coalesce(cardinality(payloads), 0) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock_shared({_LOCK});
    IF NOT EXISTS (SELECT FROM notification_listeners WHERE origin <> split_part(payloads[1], ' ', 1)) THEN
        RETURN 0;
    END IF;
    PERFORM pg_notify(channel, payload) FROM unnest(payloads) AS payload;
    RETURN cardinality(payloads);
END $$
"""


def upgrade() -> None:
    op.create_table('notification_listeners',
    sa.Column('pid', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('origin', sa.String(length=16), nullable=False),
    sa.PrimaryKeyConstraint('pid', name=op.f('pk_notification_listeners'))
    )
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(_LISTEN)
        op.execute(_NOTIFY)


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute('DROP FUNCTION agent_gateway_notify(text, text[])')
        op.execute('DROP FUNCTION agent_gateway_listen(text)')
    op.drop_table('notification_listeners')
