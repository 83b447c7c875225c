"""Event store: the events log, its projections and the sink's consumer offsets.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

JSON_DATA = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
UUID_TEXT = sa.String(length=36)


def _col(name: str, kind: sa.types.TypeEngine | type, nullable: bool = False) -> sa.Column:
    return sa.Column(name, kind, nullable=nullable)


def _optional(*specs: tuple[str, sa.types.TypeEngine | type]) -> list[sa.Column]:
    return [_col(name, kind, nullable=True) for name, kind in specs]


def _indexes(table: str, *columns: tuple[str, ...]) -> None:
    with op.batch_alter_table(table) as batch:
        for cols in columns:
            batch.create_index(batch.f(f"ix_{table}_{'_'.join(cols)}"), list(cols), unique=False)


def upgrade() -> None:
    op.create_table(
        "consumer_offsets",
        _col("consumer", sa.String()),
        _col("topic", sa.String()),
        _col("partition", sa.BigInteger()),
        _col("next_offset", sa.BigInteger()),
        _col("updated_ns", sa.BigInteger()),
        sa.PrimaryKeyConstraint("consumer", "topic", "partition", name=op.f("pk_consumer_offsets")),
    )
    op.create_table(
        "events",
        _col("id", UUID_TEXT),
        _col("type", sa.String()),
        _col("schema_version", sa.BigInteger()),
        _col("run_id", sa.String()),
        *_optional(("group_id", sa.String()), ("trajectory_id", sa.String()), ("task_id", sa.String())),
        _col("seq", sa.BigInteger()),
        _col("policy_version", sa.BigInteger()),
        _col("time_ns", sa.BigInteger()),
        _col("source", sa.String()),
        _col("causation_id", UUID_TEXT, nullable=True),
        _col("data", JSON_DATA),
        _col("kafka_topic", sa.String()),
        _col("kafka_partition", sa.BigInteger()),
        _col("kafka_offset", sa.BigInteger()),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
        sa.UniqueConstraint(
            "kafka_topic",
            "kafka_partition",
            "kafka_offset",
            name=op.f("uq_events_kafka_topic_kafka_partition_kafka_offset"),
        ),
    )
    _indexes("events", ("group_id",), ("run_id", "type", "time_ns"), ("trajectory_id", "seq"))
    op.create_table(
        "trajectories",
        _col("trajectory_id", sa.String()),
        _col("run_id", sa.String()),
        *_optional(
            ("group_id", sa.String()),
            ("task_id", sa.String()),
            ("attempt", sa.BigInteger()),
            ("retry", sa.BigInteger()),
            ("group_size", sa.BigInteger()),
            ("limits", JSON_DATA),
            ("started_ns", sa.BigInteger()),
            ("start_policy_version", sa.BigInteger()),
            ("prompt_tokens", sa.BigInteger()),
            ("tests_reward", sa.Float()),
            ("tests_duration_s", sa.Float()),
            ("fail_to_pass_passed", sa.BigInteger()),
            ("fail_to_pass_total", sa.BigInteger()),
            ("pass_to_pass_passed", sa.BigInteger()),
            ("pass_to_pass_total", sa.BigInteger()),
            ("finished_ns", sa.BigInteger()),
            ("end_policy_version", sa.BigInteger()),
            ("outcome", sa.String()),
            ("reward", sa.Float()),
            ("turns", sa.BigInteger()),
            ("generated_tokens", sa.BigInteger()),
            ("context_tokens", sa.BigInteger()),
            ("last_seq", sa.BigInteger()),
            ("error", sa.String()),
            ("llm_s", sa.Float()),
            ("tool_s", sa.Float()),
            ("sandbox_start_s", sa.Float()),
            ("agent_install_s", sa.Float()),
            ("tests_s", sa.Float()),
            ("queue_s", sa.Float()),
            ("total_s", sa.Float()),
        ),
        sa.PrimaryKeyConstraint("trajectory_id", name=op.f("pk_trajectories")),
    )
    _indexes("trajectories", ("group_id",), ("run_id", "outcome"), ("task_id",))
    op.create_table(
        "turns",
        _col("trajectory_id", sa.String()),
        _col("turn", sa.BigInteger()),
        _col("event_id", UUID_TEXT),
        _col("run_id", sa.String()),
        _col("group_id", sa.String(), nullable=True),
        _col("seq", sa.BigInteger()),
        _col("time_ns", sa.BigInteger()),
        _col("observation_tokens", sa.BigInteger()),
        _col("output_tokens", sa.BigInteger()),
        _col("finish_reason", sa.String()),
        _col("engine_id", sa.String()),
        _col("weight_version", sa.BigInteger()),
        _col("oldest_output_version", sa.BigInteger(), nullable=True),
        _col("context_tokens", sa.BigInteger()),
        _col("queue_wait_s", sa.Float()),
        _col("latency_s", sa.Float()),
        sa.PrimaryKeyConstraint("trajectory_id", "turn", name=op.f("pk_turns")),
    )
    _indexes("turns", ("engine_id", "time_ns"), ("run_id", "weight_version"))
    op.create_table(
        "tool_calls",
        _col("event_id", UUID_TEXT),
        _col("trajectory_id", sa.String()),
        _col("turn", sa.BigInteger()),
        _col("run_id", sa.String()),
        _col("time_ns", sa.BigInteger()),
        _col("command", sa.String()),
        _col("exit_code", sa.BigInteger(), nullable=True),
        _col("output_chars", sa.BigInteger()),
        _col("output_bytes", sa.BigInteger()),
        _col("truncated", sa.Boolean()),
        _col("duration_s", sa.Float()),
        _col("timed_out", sa.Boolean()),
        _col("format_error", sa.Boolean()),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_tool_calls")),
    )
    _indexes("tool_calls", ("run_id", "timed_out"), ("trajectory_id", "turn"))
    op.create_table(
        "sandbox_lifecycle",
        _col("trajectory_id", sa.String()),
        _col("run_id", sa.String()),
        _col("group_id", sa.String(), nullable=True),
        _col("backend", sa.String()),
        *_optional(
            ("sandbox_id", sa.String()),
            ("requested_ns", sa.BigInteger()),
            ("ready_ns", sa.BigInteger()),
            ("failed_ns", sa.BigInteger()),
            ("released_ns", sa.BigInteger()),
            ("queue_wait_s", sa.Float()),
            ("start_s", sa.Float()),
            ("error_kind", sa.String()),
            ("error_message", sa.String()),
            ("lifetime_s", sa.Float()),
        ),
        sa.PrimaryKeyConstraint("trajectory_id", name=op.f("pk_sandbox_lifecycle")),
    )
    _indexes("sandbox_lifecycle", ("error_kind",), ("run_id", "backend"))
    op.create_table(
        "weight_versions",
        _col("run_id", sa.String()),
        _col("version", sa.BigInteger()),
        _col("event_id", UUID_TEXT),
        _col("step", sa.BigInteger()),
        _col("path", sa.String()),
        _col("published_ns", sa.BigInteger()),
        _col("source", sa.String()),
        sa.PrimaryKeyConstraint("run_id", "version", name=op.f("pk_weight_versions")),
    )
    op.create_table(
        "trainer_steps",
        _col("run_id", sa.String()),
        _col("step", sa.BigInteger()),
        _col("event_id", UUID_TEXT),
        _col("version", sa.BigInteger()),
        _col("groups", sa.BigInteger()),
        _col("trajectories", sa.BigInteger()),
        _col("loss", sa.Float()),
        _col("grad_norm", sa.Float()),
        _col("mean_logprob_diff", sa.Float()),
        _col("ess", sa.Float()),
        _col("times", JSON_DATA),
        _col("time_ns", sa.BigInteger()),
        sa.PrimaryKeyConstraint("run_id", "step", name=op.f("pk_trainer_steps")),
    )


def downgrade() -> None:
    for table in (
        "trainer_steps",
        "weight_versions",
        "sandbox_lifecycle",
        "tool_calls",
        "turns",
        "trajectories",
        "events",
        "consumer_offsets",
    ):
        op.drop_table(table)
