"""The columns an outbox table has after its own, as migrations 0003 (webhook deliveries) and 0005
(channel deliveries) created them (``store.outbox`` names what each is for).

Part of those migrations' history: never change it; a later change of an outbox table is a
migration of its own.
"""

from __future__ import annotations

import sqlalchemy as sa


def outbox_columns() -> list[sa.Column]:
    return [
        sa.Column('created_at', sa.String(length=24), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('next_attempt_at', sa.String(length=24), nullable=False),
        sa.Column('retry_from', sa.String(length=24), nullable=False),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.Column('delivered_at', sa.String(length=24), nullable=True),
    ]
