"""The schema (SQLAlchemy Core), one table per noun of the spec.

Timestamps are stored as the canonical text of ``clock.format_instant`` so
they read back byte for byte and sort in time order on both backends. JSON
values (Attributes, payloads, Schedule data) are stored as JSON text, which
keeps them exactly as written, key order included (JSONB would not).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from agent_gateway import jsontext

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
    }
)

# SQLite only numbers rows with INTEGER PRIMARY KEY; PostgreSQL gets a BIGINT sequence.
Serial = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Instant = sa.String(24)
Uuid = sa.String(36)


class JSONText(sa.types.TypeDecorator[Any]):
    """Any JSON value, stored as its text."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> str:
        return jsontext.dumps(value).decode()

    def process_result_value(self, value: str | None, dialect: sa.Dialect) -> Any:
        return None if value is None else jsontext.loads(value)


users = sa.Table(
    "users",
    metadata,
    sa.Column("id", Uuid, primary_key=True),
    sa.Column("attributes", JSONText, nullable=False),
    sa.Column("created_at", Instant, nullable=False),
    # scrypt digest text recording its own cost; null for a User with no password.
    sa.Column("password_digest", sa.Text, nullable=True),
    sa.Index(None, "created_at", "id"),
)

tokens = sa.Table(
    "tokens",
    metadata,
    # SHA-256 of the Token; the plaintext is never stored.
    sa.Column("digest", sa.String(64), primary_key=True),
    sa.Column("user_id", Uuid, sa.ForeignKey("users.id"), nullable=False, index=True),
    sa.Column("created_at", Instant, nullable=False),
    sa.Column("expires_at", Instant, nullable=False),
)

decisions = sa.Table(
    "decisions",
    metadata,
    sa.Column("seq", Serial, primary_key=True, autoincrement=True),
    # JSON text, so that any Statement (NUL included, which PostgreSQL text refuses) reads back exactly.
    sa.Column("statement", JSONText, nullable=False),
    sa.Column("jws", sa.Text, nullable=False),
    sa.Column("created_at", Instant, nullable=False),
    # The Decision's leaf in the Merkle tree (store.queries.tree), from 0 in seq order without gaps;
    # written with the Decision. Nullable only so that SQLite adds it without rebuilding the
    # table; unique through the tree's own key (a leaf is one row of decision_tree), so no index.
    sa.Column("leaf_index", sa.BigInteger, nullable=True),
    sqlite_autoincrement=True,
)

# The hashes of the complete subtrees of the Merkle tree over the Decision log (store.queries.tree):
# ``node`` names the subtree of 2**level leaves from index * 2**level (see store.queries.tree.key).
decision_tree = sa.Table(
    "decision_tree",
    metadata,
    # On SQLite the row id itself (no second index to write): see Serial.
    sa.Column("node", Serial, primary_key=True, autoincrement=False),
    sa.Column("hash", sa.LargeBinary(32), nullable=False),
)

INSTRUCTIONS_ONLY = sa.text("kind = 'instructions'")

# The Run ledger (issue 41; store.queries.ledger): what the gateway told the agent, one entry per
# instructions change and per Run started, numbered from 1 without gaps as Decisions are; ``leaf`` is the entry's
# leaf in the ledger's Merkle tree (ledger_tree), byte for byte: its RFC 8785 canonical JSON.
ledger_entries = sa.Table(
    "ledger_entries",
    metadata,
    # The entry's number; its leaf in ledger_tree is seq - 1. On SQLite the row id itself.
    sa.Column("seq", Serial, primary_key=True, autoincrement=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("leaf", sa.Text, nullable=False),
    # The Run of a run entry, as processes before migration 0015 wrote it (they may still run
    # during a rolling restart); unindexed. Since 0015 the Run names its entry (runs.entry_seq).
    sa.Column("run_id", Uuid, nullable=True),
    sa.CheckConstraint("kind IN ('instructions', 'run')", name="kind"),
    # The instructions entry in force is the newest one (store.queries.ledger.last_instructions).
    # Partial, so a Run's entry writes no entry in it (a page less in each Run's commit); a query
    # uses it only with the literal 'instructions' (INSTRUCTIONS_ONLY).
    sa.Index("ix_ledger_entries_instructions", "seq", sqlite_where=INSTRUCTIONS_ONLY, postgresql_where=INSTRUCTIONS_ONLY),
)

# The hashes of the complete subtrees of the Run ledger's Merkle tree, as decision_tree's.
ledger_tree = sa.Table(
    "ledger_tree",
    metadata,
    sa.Column("node", Serial, primary_key=True, autoincrement=False),
    sa.Column("hash", sa.LargeBinary(32), nullable=False),
)

signals = sa.Table(
    "signals",
    metadata,
    # Emission order: ties of emitted_at are broken by this number.
    sa.Column("position", Serial, primary_key=True, autoincrement=True),
    sa.Column("id", Uuid, nullable=False, unique=True),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("payload", JSONText, nullable=False),
    sa.Column("emitted_at", Instant, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("error", sa.Text, nullable=True),
    # What emitted it: a Message ("message"), a Schedule ("schedule"), or the operator's own code
    # ("operator"); the Run ledger records it with each Run (ledger.entries).
    sa.Column("origin", sa.String(16), nullable=False, server_default="operator"),
    sa.CheckConstraint("state IN ('pending', 'processing', 'done', 'failed')", name="state"),
    sa.Index(None, "state", "emitted_at", "position"),
    # GET /signals reads newest first, with or without a kind.
    sa.Index(None, "emitted_at", "position"),
    sa.Index(None, "kind", "emitted_at", "position"),
    sqlite_autoincrement=True,
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("position", Serial, primary_key=True, autoincrement=True),
    sa.Column("id", Uuid, nullable=False, unique=True),
    sa.Column("signal_id", Uuid, sa.ForeignKey("signals.id"), nullable=False, index=True),
    sa.Column("session", sa.Text, nullable=True),
    sa.Column("prompt", sa.Text, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("started_at", Instant, nullable=True),
    sa.Column("ended_at", Instant, nullable=True),
    # The number of its Run ledger entry, once started: written with it, in its statement or
    # transaction (store.queries.ledger). Not indexed: a receipt finds the entries through the
    # Runs of a Signal, then their primary key.
    sa.Column("entry_seq", sa.BigInteger, nullable=True),
    sa.CheckConstraint("state IN ('pending', 'running', 'done', 'failed')", name="state"),
    sa.Index(None, "started_at", "position"),
    sqlite_autoincrement=True,
)

# Literal, not bound: a partial index serves only a condition the planner sees whole.
INBOUND_ONLY = sa.text("direction = 'inbound'")

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("user_id", Uuid, sa.ForeignKey("users.id"), primary_key=True),
    # Numbered per User inside the insert; the primary key exposes a lost race.
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("id", sa.String(36), nullable=False, unique=True),
    sa.Column("direction", sa.String(8), nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("created_at", Instant, nullable=False),
    sa.CheckConstraint("direction IN ('inbound', 'outbound')", name="direction"),
    # A User's most recent inbound Message, found in one step however many outbound ones follow
    # it (where a channel sends an answer: store.queries.channels.routes). Partial, so an outbound
    # Message writes no entry; a query uses it only with the literal 'inbound' (INBOUND_ONLY).
    sa.Index("ix_messages_inbound", "user_id", "seq", sqlite_where=INBOUND_ONLY, postgresql_where=INBOUND_ONLY),
)

schedules = sa.Table(
    "schedules",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("kind", sa.String(8), nullable=False),
    sa.Column("at", Instant, nullable=True),
    sa.Column("expr", sa.Text, nullable=True),
    sa.Column("tz", sa.Text, nullable=True),
    sa.Column("until", Instant, nullable=True),
    sa.Column("data", JSONText, nullable=False),
    sa.Column("next_fire_at", Instant, nullable=False),
    sa.Column("updated_at", Instant, nullable=False),
    sa.CheckConstraint("kind IN ('once', 'cron')", name="kind"),
    sa.Index(None, "next_fire_at", "name"),
)


def outbox_columns() -> list[sa.SchemaItem]:
    """What every outbox table has (store.outbox), new objects for each table that asks."""
    return [
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        # When it is next due; a claim moves it past the attempt (the lease), so a sender that
        # dies mid-attempt leaves it due again once the lease is over. A closed row keeps here
        # when it closed (retention reads it).
        sa.Column("next_attempt_at", Instant, nullable=False),
        # Retries end (dead) a sender's retry_for after this: the row's writing, or an
        # operator's retry.
        sa.Column("retry_from", Instant, nullable=False),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("delivered_at", Instant, nullable=True),
        sa.CheckConstraint("state IN ('pending', 'failed', 'delivered', 'dead')", name="state"),
        sa.Index(None, "state", "next_attempt_at"),
    ]


# The webhook outbox: one row per (endpoint, event), written in the transaction of the event
# it reports (webhooks/outbox.py), sent at least once by the deliverer (webhooks/deliverer.py).
webhook_deliveries = sa.Table(
    "webhook_deliveries",
    metadata,
    # Insertion order, which is event order: each endpoint's deliveries are sent in this order.
    sa.Column("position", Serial, primary_key=True, autoincrement=True),
    # The Standard Webhooks message id (webhook-id), the same on every attempt: a UUID version 7,
    # unique by its random bits. No index of its own (each outbox row would pay for it): every
    # lookup by id also names the state, and goes through the state index (store.queries.webhooks).
    sa.Column("id", Uuid, nullable=False),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("event", sa.String(32), nullable=False),
    # The exact body sent on every attempt: {"type", "timestamp", "data"} as JSON text; or
    # NULL with decision_seq: a Decision never changes and is never removed, so its body is
    # composed from it at each attempt, the same bytes each time, and not copied here.
    sa.Column("body", sa.Text, nullable=True),
    sa.Column("decision_seq", sa.BigInteger, nullable=True),
    sa.Column("created_at", Instant, nullable=False),
    *outbox_columns(),
    sa.CheckConstraint("(body IS NULL) <> (decision_seq IS NULL)", name="body"),
    sqlite_autoincrement=True,
)

# --- chat channels (channels/): identities, pairing, conversations, read positions, the outbox ---

channel_identities = sa.Table(
    "channel_identities",
    metadata,
    # "<channel>:<address>" (matrix:@alice:example.org): one User each, a User any number.
    sa.Column("identity", sa.Text, primary_key=True),
    sa.Column("channel", sa.String(32), nullable=False),
    sa.Column("user_id", Uuid, sa.ForeignKey("users.id"), nullable=False),
    sa.Column("created_at", Instant, nullable=False),
    sa.Index(None, "user_id"),
)

channel_pairings = sa.Table(
    "channel_pairings",
    metadata,
    # Pending requests only: an approval or a denial removes the row, and so does expiry when
    # the identity writes again or the channel's cap is counted.
    sa.Column("code", sa.String(8), primary_key=True),
    sa.Column("channel", sa.String(32), nullable=False),
    sa.Column("identity", sa.Text, nullable=False, unique=True),
    sa.Column("created_at", Instant, nullable=False),
    sa.Column("expires_at", Instant, nullable=False),
    sa.Index(None, "channel", "expires_at"),
)


def conversation_columns(*, to_open: bool = False) -> list[sa.SchemaItem]:
    """A User's conversation on a channel (Matrix: a room): the one of their most recent inbound
    Message taken from a channel in it, with that Message's seq (none for one the gateway opened).
    ``to_open``: the conversation may be NULL, one to open with the identity."""
    return [
        sa.Column("user_id", Uuid, sa.ForeignKey("users.id"), primary_key=True),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("identity", sa.Text, nullable=False),
        sa.Column("conversation", sa.Text, nullable=to_open),
        sa.Column("inbound_seq", sa.BigInteger, nullable=True),
        sa.Column("updated_at", Instant, nullable=False),
    ]


# Where a User's outbound Messages go (channels.outbox.target): their private conversation (a
# direct room, a Nostr direct message) gets everything, while their most recent inbound Message
# came by a channel (one through the Public server since takes them off it). A direct room found
# shared (someone invited to it) stays with its conversation NULL: the next delivery opens another.
# Every read of a group room takes it off any User's private conversation (forget_private): by this index.
channel_conversations = sa.Table(
    "channel_conversations", metadata, *conversation_columns(to_open=True), sa.Index(None, "channel", "conversation")
)
# Their shared one (a group room, where others read) gets only the answers to the Message
# written in it, written while its Signal is handled.
channel_shared_conversations = sa.Table("channel_shared_conversations", metadata, *conversation_columns())

channel_positions = sa.Table(
    "channel_positions",
    metadata,
    # How far each channel has read (Matrix: the sync token), committed with what it stored.
    sa.Column("channel", sa.String(32), primary_key=True),
    sa.Column("position", sa.Text, nullable=False),
    sa.Column("updated_at", Instant, nullable=False),
)

channel_deliveries = sa.Table(
    "channel_deliveries",
    metadata,
    # The channel outbox (store.outbox): one row per text to send on a channel.
    sa.Column("position", Serial, primary_key=True, autoincrement=True),
    # A UUID version 7; Matrix's transaction id of the send, the same on every attempt, so the
    # homeserver keeps one event however often it is sent.
    sa.Column("id", Uuid, nullable=False),
    sa.Column("channel", sa.String(32), nullable=False),
    sa.Column("identity", sa.Text, nullable=False),
    # NULL: a conversation is opened with the identity at the first attempt, and written here.
    sa.Column("conversation", sa.Text, nullable=True),
    # "message" (an outbound Message: its id, its User, its exact text) or "notice" (the
    # channel's own words: a pairing code, "only text is read").
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("user_id", Uuid, nullable=True),
    sa.Column("message_id", Uuid, nullable=True),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("created_at", Instant, nullable=False),
    *outbox_columns(),
    sa.CheckConstraint("kind IN ('message', 'notice')", name="kind"),
    sqlite_autoincrement=True,
)

witness_cosignatures = sa.Table(
    "witness_cosignatures",
    metadata,
    # One witness's cosignature (c2sp.org/tlog-cosignature) of the checkpoint of one tree size,
    # kept so that a witnessed checkpoint is served at once after a restart (transparency.collector).
    # A size has one root (the tree is append-only), so the size names the checkpoint.
    sa.Column("witness", sa.Text, primary_key=True),  # its verifier key, as configured
    sa.Column("tree_size", sa.BigInteger, primary_key=True),
    sa.Column("line", sa.Text, nullable=False),  # the signature line, without its newline
)

# The same of the Run ledger's checkpoints (its own origin, its own sizes).
ledger_witness_cosignatures = sa.Table(
    "ledger_witness_cosignatures",
    metadata,
    sa.Column("witness", sa.Text, primary_key=True),
    sa.Column("tree_size", sa.BigInteger, primary_key=True),
    sa.Column("line", sa.Text, nullable=False),
)

nostr_auth_events = sa.Table(
    "nostr_auth_events",
    metadata,
    # The ids of NIP-98 events accepted within the replay window (auth/nip98.py): one table, so
    # every process of a deployment refuses an event another accepted. An id covers its event's
    # created_at (Unix seconds), so the pair is unique exactly when the id is; in this order new
    # ids go to the end of the key (a page or two written per batch, not one per id) and the
    # expired ones are a range at its start. No rowid on SQLite: the key is the only b-tree.
    sa.Column("created_at", sa.BigInteger, primary_key=True),
    sa.Column("event_id", sa.String(64), primary_key=True),
    sqlite_with_rowid=False,
)

notification_listeners = sa.Table(
    "notification_listeners",
    metadata,
    # PostgreSQL only (empty on SQLite): the connections listening for the deployment's wake-ups,
    # each a process's (store.notifications.PostgresListener), so that a NOTIFY is sent only when
    # a process other than the sender's listens (migration 0019 holds the functions that use it).
    sa.Column("pid", sa.Integer, primary_key=True, autoincrement=False),  # the listening backend's
    sa.Column("origin", sa.String(16), nullable=False),  # the process's Store.origin
)
