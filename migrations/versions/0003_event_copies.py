"""Event copies: `events` is keyed by (id, source), so a re-run's copy is kept beside the killed run's.

A rollout worker killed mid-episode leaves a partial copy of its trajectory that
the re-run writes again under the same event ids from another source (with
possibly other samples). Keyed by id alone, the store kept whichever copy came
first; keyed by (id, source) it keeps both, as the topics do, and the writer
projects the copy the fold keeps (`streams.assemble.dedupe_by_seq`).

Existing rows carry over unchanged: they hold one copy per id, so they are
unique under the new key too (SQLite rebuilds the table in batch mode and copies
them; PostgreSQL swaps the constraint in place). Downgrading keeps the first copy
of each id in Kafka order (what revision 0001's sink kept) and restores the old key.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

# Later copies of an id than the first in Kafka order (row values compare on SQLite >= 3.15 and PostgreSQL).
LATER_COPIES = sa.text(
    "DELETE FROM events WHERE EXISTS (SELECT 1 FROM events AS first WHERE first.id = events.id AND "
    "(first.kafka_topic, first.kafka_partition, first.kafka_offset) "
    "< (events.kafka_topic, events.kafka_partition, events.kafka_offset))"
)


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_constraint("pk_events", type_="primary")
        batch.create_primary_key("pk_events", ["id", "source"])


def downgrade() -> None:
    op.execute(LATER_COPIES)
    with op.batch_alter_table("events") as batch:
        batch.drop_constraint("pk_events", type_="primary")
        batch.create_primary_key("pk_events", ["id"])
