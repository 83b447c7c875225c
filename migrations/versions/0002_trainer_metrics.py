"""Trainer metrics: `trainer_steps` gets every figure of TrainerStep v2, `weight_versions` its checksum.

The new columns are NOT NULL with server defaults, so existing rows carry over
(a v1 step had no mode, clip fractions, entropy ...: they read as rl / 0 / [] as a
v1 event upcast to v2 does); the defaults then go, as the models have none.
Downgrading drops the columns again.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

JSON_DATA = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

# (column, type, server default for rows written before this revision)
TRAINER_STEP_COLUMNS: tuple[tuple[str, sa.types.TypeEngine, str], ...] = (
    ("mode", sa.String(), "rl"),
    ("group_ids", JSON_DATA, "[]"),
    ("clip_frac_low", sa.Float(), "0"),
    ("clip_frac_high", sa.Float(), "0"),
    ("entropy", sa.Float(), "0"),
    ("ess_seq", sa.Float(), "1"),
    ("reward_mean", sa.Float(), "0"),
    ("zero_variance_groups", sa.BigInteger(), "0"),
    ("stale_groups", sa.BigInteger(), "0"),
    ("staleness_mean", sa.Float(), "0"),
    ("staleness_max", sa.BigInteger(), "0"),
    ("tokens", sa.BigInteger(), "0"),
)


def upgrade() -> None:
    with op.batch_alter_table("trainer_steps") as batch:
        for name, kind, default in TRAINER_STEP_COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=False, server_default=sa.text(repr(default))))
    with op.batch_alter_table("weight_versions") as batch:
        batch.add_column(sa.Column("checksum", sa.String(), nullable=False, server_default=sa.text("''")))
    with op.batch_alter_table("trainer_steps") as batch:
        for name, _kind, _default in TRAINER_STEP_COLUMNS:
            batch.alter_column(name, server_default=None)
    with op.batch_alter_table("weight_versions") as batch:
        batch.alter_column("checksum", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("weight_versions") as batch:
        batch.drop_column("checksum")
    with op.batch_alter_table("trainer_steps") as batch:
        for name, _kind, _default in reversed(TRAINER_STEP_COLUMNS):
            batch.drop_column(name)
