"""SQLAlchemy 2 models of the SQL event store: the `events` log and its projections.

`events` holds every event the sink has read, one row per (event id, source), with
the Kafka position it was read from (topic, partition, offset: unique together):
a rollout worker killed mid-episode and its re-run write the same ids from two
sources, and both copies are kept, as on the topics. The projections are folds of
`events` that answer the common questions without parsing JSON: one row per
trajectory, turn, tool call, sandbox, weight version and trainer step; a
trajectory with copies from several runs shows the copy fold and replay choose
(`streams.assemble.dedupe_by_seq`: the finishing run's). `consumer_offsets` is
the sink's position per partition, written in the same transaction as the rows,
so the database (not Kafka) says where to resume.

The schema is created and changed only by the alembic migrations in
`migrations/`; a test checks that these models and the migrated schema agree.
Ids are strings (UUIDs with dashes) so that hand-written SQL can compare them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import JSON, BigInteger, Boolean, Float, Index, MetaData, String, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# JSONB on PostgreSQL (indexable, compact), JSON text on SQLite.
JsonData = JSON().with_variant(JSONB(), "postgresql")

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        int: BigInteger,
        float: Float,
        str: String,
        dict[str, Any]: JsonData,
    }


class EventRow(Base):
    """One event as it was on the wire; `data` is the payload's JSON (token arrays stay packed).

    Keyed by (id, source): an exact copy (same id, same writer) is stored once, a re-run's copy beside it."""

    __tablename__ = "events"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    type: Mapped[str]
    schema_version: Mapped[int]
    run_id: Mapped[str]
    group_id: Mapped[str | None]
    trajectory_id: Mapped[str | None]
    task_id: Mapped[str | None]
    seq: Mapped[int]
    policy_version: Mapped[int | None]  # None: not known yet (before an episode's first generation)
    time_ns: Mapped[int]
    source: Mapped[str] = mapped_column(primary_key=True)
    causation_id: Mapped[str | None] = mapped_column(String(36))
    data: Mapped[dict[str, Any]]
    kafka_topic: Mapped[str]
    kafka_partition: Mapped[int]
    kafka_offset: Mapped[int]
    __table_args__ = (
        UniqueConstraint("kafka_topic", "kafka_partition", "kafka_offset"),
        Index(None, "trajectory_id", "seq"),
        Index(None, "run_id", "type", "time_ns"),
        Index(None, "group_id"),
    )


class Trajectory(Base):
    """An episode: filled by trajectory.started, tests.ran and trajectory.finished."""

    __tablename__ = "trajectories"
    trajectory_id: Mapped[str] = mapped_column(primary_key=True)
    run_id: Mapped[str]
    group_id: Mapped[str | None]
    task_id: Mapped[str | None]
    # trajectory.started
    attempt: Mapped[int | None]
    retry: Mapped[int | None]
    group_size: Mapped[int | None]
    limits: Mapped[dict[str, Any] | None]
    started_ns: Mapped[int | None]
    start_policy_version: Mapped[int | None]
    prompt_tokens: Mapped[int | None]
    # tests.ran
    tests_reward: Mapped[float | None]
    tests_duration_s: Mapped[float | None]
    fail_to_pass_passed: Mapped[int | None]
    fail_to_pass_total: Mapped[int | None]
    pass_to_pass_passed: Mapped[int | None]
    pass_to_pass_total: Mapped[int | None]
    # trajectory.finished
    finished_ns: Mapped[int | None]
    end_policy_version: Mapped[int | None]
    outcome: Mapped[str | None]
    reward: Mapped[float | None]
    turns: Mapped[int | None]
    generated_tokens: Mapped[int | None]
    context_tokens: Mapped[int | None]
    last_seq: Mapped[int | None]
    error: Mapped[str | None]
    llm_s: Mapped[float | None]
    tool_s: Mapped[float | None]
    sandbox_start_s: Mapped[float | None]
    agent_install_s: Mapped[float | None]
    tests_s: Mapped[float | None]
    queue_s: Mapped[float | None]
    total_s: Mapped[float | None]
    __table_args__ = (
        Index(None, "run_id", "outcome"),
        Index(None, "group_id"),
        Index(None, "task_id"),
    )


class Turn(Base):
    """One model call (turn.generated): token counts, not the token arrays (those stay in `events`)."""

    __tablename__ = "turns"
    trajectory_id: Mapped[str] = mapped_column(primary_key=True)
    turn: Mapped[int] = mapped_column(primary_key=True)
    event_id: Mapped[str] = mapped_column(String(36))
    run_id: Mapped[str]
    group_id: Mapped[str | None]
    seq: Mapped[int]
    time_ns: Mapped[int]
    observation_tokens: Mapped[int]
    output_tokens: Mapped[int]
    finish_reason: Mapped[str]
    engine_id: Mapped[str]
    weight_version: Mapped[int]
    oldest_output_version: Mapped[int | None]
    context_tokens: Mapped[int]
    queue_wait_s: Mapped[float]
    latency_s: Mapped[float]
    __table_args__ = (
        Index(None, "run_id", "weight_version"),
        Index(None, "engine_id", "time_ns"),
    )


class ToolCall(Base):
    """One command run in a sandbox (tool.executed); the output shown is in `events.data`."""

    __tablename__ = "tool_calls"
    event_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    trajectory_id: Mapped[str]
    turn: Mapped[int]
    run_id: Mapped[str]
    time_ns: Mapped[int]
    command: Mapped[str]
    exit_code: Mapped[int | None]
    output_chars: Mapped[int]
    output_bytes: Mapped[int]
    truncated: Mapped[bool] = mapped_column(Boolean)
    duration_s: Mapped[float]
    timed_out: Mapped[bool] = mapped_column(Boolean)
    format_error: Mapped[bool] = mapped_column(Boolean)
    __table_args__ = (
        Index(None, "trajectory_id", "turn"),
        Index(None, "run_id", "timed_out"),
    )


class SandboxLifecycle(Base):
    """A trajectory's sandbox: requested, ready or failed, released (sandbox.*)."""

    __tablename__ = "sandbox_lifecycle"
    trajectory_id: Mapped[str] = mapped_column(primary_key=True)
    run_id: Mapped[str]
    group_id: Mapped[str | None]
    backend: Mapped[str]
    sandbox_id: Mapped[str | None]
    requested_ns: Mapped[int | None]
    ready_ns: Mapped[int | None]
    failed_ns: Mapped[int | None]
    released_ns: Mapped[int | None]
    queue_wait_s: Mapped[float | None]
    start_s: Mapped[float | None]
    error_kind: Mapped[str | None]
    error_message: Mapped[str | None]
    lifetime_s: Mapped[float | None]
    __table_args__ = (
        Index(None, "run_id", "backend"),
        Index(None, "error_kind"),
    )


class WeightVersion(Base):
    """A published policy version (weights.published)."""

    __tablename__ = "weight_versions"
    run_id: Mapped[str] = mapped_column(primary_key=True)
    version: Mapped[int] = mapped_column(primary_key=True)
    event_id: Mapped[str] = mapped_column(String(36))
    step: Mapped[int]
    path: Mapped[str]
    published_ns: Mapped[int]
    source: Mapped[str]
    checksum: Mapped[str]  # sha256 of the directory (trainer.versions.directory_sha256); '' = unchecked


class TrainerStepRow(Base):
    """One optimiser step (trainer.step, schema v2) with its stability metrics and time breakdown."""

    __tablename__ = "trainer_steps"
    run_id: Mapped[str] = mapped_column(primary_key=True)
    step: Mapped[int] = mapped_column(primary_key=True)
    event_id: Mapped[str] = mapped_column(String(36))
    version: Mapped[int]
    groups: Mapped[int]
    trajectories: Mapped[int]
    loss: Mapped[float]
    grad_norm: Mapped[float]
    mean_logprob_diff: Mapped[float]
    ess: Mapped[float]
    times: Mapped[dict[str, Any]]
    time_ns: Mapped[int]
    # added by revision 0002 (TrainerStep v2)
    mode: Mapped[str]
    group_ids: Mapped[list[str]] = mapped_column(JsonData)
    clip_frac_low: Mapped[float]
    clip_frac_high: Mapped[float]
    entropy: Mapped[float]
    ess_seq: Mapped[float]
    reward_mean: Mapped[float]
    zero_variance_groups: Mapped[int]
    stale_groups: Mapped[int]
    staleness_mean: Mapped[float]
    staleness_max: Mapped[int]
    tokens: Mapped[int]


class ConsumerOffset(Base):
    """Next offset to read per (consumer, topic, partition); written with the rows it covers."""

    __tablename__ = "consumer_offsets"
    consumer: Mapped[str] = mapped_column(primary_key=True)
    topic: Mapped[str] = mapped_column(primary_key=True)
    partition: Mapped[int] = mapped_column(primary_key=True)
    next_offset: Mapped[int]
    updated_ns: Mapped[int]
