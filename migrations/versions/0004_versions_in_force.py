"""Weight versions in force: `events.policy_version` may be NULL, and trajectories are attributed to
the version of their first token.

Rollout events of schema v2 carry no `policy_version` until the episode's first generation
says which version is in force (v1 wrote a made-up 0 there; `streams.events` reads v1
records as v2). `trajectories.start_policy_version` is now the version of the first
generated token (turn 1's; NULL for a trajectory that never generated), so rows written
before this revision, which all held the made-up 0, are set again from `turns`, and the
`end_policy_version` of a trajectory that finished without a turn (a v1 0) becomes NULL.
`events` rows stay as they were written (v1 rows read through the upcaster).

Downgrading makes `events.policy_version` NOT NULL again, with 0 where it was NULL (what
v1 wrote); the trajectories keep their first-token versions.

Revision ID: 0004
Revises: 0003
Create Date: 2027-01-15
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None

FIRST_TOKEN_VERSION = sa.text(
    "UPDATE trajectories SET start_policy_version = ("
    "SELECT COALESCE(turns.oldest_output_version, turns.weight_version) FROM turns "
    "WHERE turns.trajectory_id = trajectories.trajectory_id AND turns.turn = 1)"
)
NO_TURN_NO_VERSION = sa.text("UPDATE trajectories SET end_policy_version = NULL WHERE turns = 0")


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.alter_column("policy_version", existing_type=sa.BigInteger(), nullable=True)
    op.execute(FIRST_TOKEN_VERSION)
    op.execute(NO_TURN_NO_VERSION)


def downgrade() -> None:
    op.execute(sa.text("UPDATE events SET policy_version = 0 WHERE policy_version IS NULL"))
    with op.batch_alter_table("events") as batch:
        batch.alter_column("policy_version", existing_type=sa.BigInteger(), nullable=False)
