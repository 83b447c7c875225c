"""Pure functions from events to rows: the `events` row and each projection's row.

No SQL and no clock here: `writer` executes what these return. Events arrive as
`WireEvent`s (`streams.store.wire`: token arrays still packed), so projections
count tokens without unpacking them. A projection is a `ProjectionRow` (table,
key columns, values; JSON columns as JSON text); the writer upserts it, setting
only the columns that event type determines, so the three event types that fill
one `trajectories` row never overwrite each other and applying the same event
twice changes nothing. A trajectory's `start_policy_version` is the version of its
first generated token (turn 1's), set by that `turn.generated`: the version in force
when it started is not known before then, and a trajectory that never generated has none.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streams.events import Event, event_from_dict
from streams.store.wire import WireEvent, packed_count, packed_min

INT32 = 4  # bytes per packed token id


@dataclass(frozen=True)
class StoredEvent:
    """An event (as validated on the wire) with the Kafka position it was read from (full topic name)."""

    event: WireEvent
    topic: str
    partition: int
    offset: int
    data_json: str | None = None  # the payload's JSON text when the reader has it (else serialised)


@dataclass(frozen=True, slots=True)
class ProjectionRow:
    """Upsert `values` into `table`; on a key conflict set every non-key column in `values`."""

    table: str
    key: tuple[str, ...]
    values: dict[str, Any]


def event_row(stored: StoredEvent) -> dict[str, Any]:
    """The `events` row: the envelope's columns, `data` as its wire JSON text, and the Kafka position."""
    event = stored.event
    return {
        "id": str(event.id),
        "type": event.type,
        "schema_version": event.schema_version,
        "run_id": event.run_id,
        "group_id": event.group_id,
        "trajectory_id": event.trajectory_id,
        "task_id": event.task_id,
        "seq": event.seq,
        "policy_version": event.policy_version,
        "time_ns": event.time_ns,
        "source": event.source,
        "causation_id": str(event.causation_id) if event.causation_id else None,
        "data": stored.data_json if stored.data_json is not None else event.data.model_dump_json(),
        "kafka_topic": stored.topic,
        "kafka_partition": stored.partition,
        "kafka_offset": stored.offset,
    }


def event_from_row(row: Any) -> Event:
    """The `Event` an `events` row (mapping or Row with the column names) holds, upcast when the row
    was written under an older schema version.

    `data` may be the decoded JSON (ORM or typed select) or its text (plain SQL on SQLite).
    """
    mapping = row._mapping if hasattr(row, "_mapping") else row
    data = mapping["data"]
    record = {name: mapping[name] for name in Event.ENVELOPE_FIELDS}
    return event_from_dict(record | {"data": json.loads(data) if isinstance(data, str) else data})


def projection_rows(event: WireEvent) -> list[ProjectionRow]:
    """The projection rows `event` determines (none for types without a projection)."""
    project = _PROJECTORS.get(event.type)
    return project(event) if project is not None else []


def _identity(event: WireEvent) -> dict[str, Any]:
    return {"trajectory_id": event.trajectory_id, "run_id": event.run_id, "group_id": event.group_id}


def _trajectory_started(event: WireEvent) -> list[ProjectionRow]:
    data = event.data
    values = _identity(event) | {
        "task_id": event.task_id,
        "attempt": data.attempt,
        "retry": data.retry,
        "group_size": data.group_size,
        "limits": data.limits.model_dump_json(),
        "started_ns": event.time_ns,
        "prompt_tokens": packed_count(data.prompt_token_ids, INT32),
    }
    return [ProjectionRow("trajectories", ("trajectory_id",), values)]


def _tests_ran(event: WireEvent) -> list[ProjectionRow]:
    data = event.data
    values = _identity(event) | {
        "task_id": event.task_id,
        "tests_reward": data.reward,
        "tests_duration_s": data.duration_s,
        "fail_to_pass_passed": sum(data.fail_to_pass.values()),
        "fail_to_pass_total": len(data.fail_to_pass),
        "pass_to_pass_passed": sum(data.pass_to_pass.values()),
        "pass_to_pass_total": len(data.pass_to_pass),
    }
    return [ProjectionRow("trajectories", ("trajectory_id",), values)]


def _trajectory_finished(event: WireEvent) -> list[ProjectionRow]:
    data = event.data
    values = _identity(event) | {
        "task_id": event.task_id,
        "finished_ns": event.time_ns,
        "end_policy_version": event.policy_version,
        "outcome": data.outcome.value,
        "reward": data.reward,
        "turns": data.turns,
        "generated_tokens": data.generated_tokens,
        "context_tokens": data.context_tokens,
        "last_seq": data.last_seq,
        "error": data.error,
        **data.times.model_dump(),
    }
    return [ProjectionRow("trajectories", ("trajectory_id",), values)]


def _turn_generated(event: WireEvent) -> list[ProjectionRow]:
    data = event.data
    values = _identity(event) | {
        "turn": data.turn,
        "event_id": str(event.id),
        "seq": event.seq,
        "time_ns": event.time_ns,
        "observation_tokens": packed_count(data.observation_token_ids, INT32),
        "output_tokens": packed_count(data.output_token_ids, INT32),
        "finish_reason": data.finish_reason,
        "engine_id": data.engine_id,
        "weight_version": data.weight_version,
        "oldest_output_version": packed_min(data.output_versions, "i"),
        "context_tokens": data.context_tokens,
        "queue_wait_s": data.queue_wait_s,
        "latency_s": data.latency_s,
    }
    rows = [ProjectionRow("turns", ("trajectory_id", "turn"), values)]
    if data.turn == 1:  # the trajectory's weight version: its first token's
        first = values["oldest_output_version"]  # versions only grow within one generation
        start = _identity(event) | {"start_policy_version": data.weight_version if first is None else first}
        rows.append(ProjectionRow("trajectories", ("trajectory_id",), start))
    return rows


def _tool_executed(event: WireEvent) -> list[ProjectionRow]:
    data = event.data
    values = {
        "event_id": str(event.id),
        "trajectory_id": event.trajectory_id,
        "turn": data.turn,
        "run_id": event.run_id,
        "time_ns": event.time_ns,
        "command": data.command,
        "exit_code": data.exit_code,
        "output_chars": len(data.output),
        "output_bytes": data.output_bytes,
        "truncated": data.truncated,
        "duration_s": data.duration_s,
        "timed_out": data.timed_out,
        "format_error": data.format_error,
    }
    return [ProjectionRow("tool_calls", ("event_id",), values)]


def _sandbox(event: WireEvent) -> list[ProjectionRow]:
    data = event.data
    values: dict[str, Any] = _identity(event) | {"backend": data.backend}
    if event.type == "sandbox.requested":
        values["requested_ns"] = event.time_ns
    elif event.type == "sandbox.ready":
        values |= {
            "sandbox_id": data.sandbox_id,
            "ready_ns": event.time_ns,
            "queue_wait_s": data.queue_wait_s,
            "start_s": data.start_s,
        }
    elif event.type == "sandbox.failed":
        values |= {
            "failed_ns": event.time_ns,
            "queue_wait_s": data.queue_wait_s,
            "error_kind": data.error_kind,
            "error_message": data.message,
        }
    else:
        values |= {"sandbox_id": data.sandbox_id, "released_ns": event.time_ns, "lifetime_s": data.lifetime_s}
    return [ProjectionRow("sandbox_lifecycle", ("trajectory_id",), values)]


def _weights_published(event: WireEvent) -> list[ProjectionRow]:
    data = event.data
    values = {
        "run_id": event.run_id,
        "version": data.version,
        "event_id": str(event.id),
        "step": data.step,
        "path": data.path,
        "published_ns": event.time_ns,
        "source": event.source,
        "checksum": data.checksum,
    }
    return [ProjectionRow("weight_versions", ("run_id", "version"), values)]


def _trainer_step(event: WireEvent) -> list[ProjectionRow]:
    data = event.data
    values = {
        "run_id": event.run_id,
        "step": data.step,
        "event_id": str(event.id),
        "version": data.version,
        "groups": data.groups,
        "trajectories": data.trajectories,
        "loss": data.loss,
        "grad_norm": data.grad_norm,
        "mean_logprob_diff": data.mean_logprob_diff,
        "ess": data.ess,
        "times": json.dumps(data.times.model_dump()),
        "time_ns": event.time_ns,
        "mode": data.mode,
        "group_ids": json.dumps(list(data.group_ids)),
        "clip_frac_low": data.clip_frac_low,
        "clip_frac_high": data.clip_frac_high,
        "entropy": data.entropy,
        "ess_seq": data.ess_seq,
        "reward_mean": data.reward_mean,
        "zero_variance_groups": data.zero_variance_groups,
        "stale_groups": data.stale_groups,
        "staleness_mean": data.staleness_mean,
        "staleness_max": data.staleness_max,
        "tokens": data.tokens,
    }
    return [ProjectionRow("trainer_steps", ("run_id", "step"), values)]


Projector = Callable[[WireEvent], list[ProjectionRow]]


def _needs_trajectory(project: Projector) -> Projector:
    """Rollout projections are keyed by trajectory; an event without one has nothing to project."""

    def guarded(event: WireEvent) -> list[ProjectionRow]:
        return project(event) if event.trajectory_id else []

    return guarded


_PROJECTORS: dict[str, Projector] = {
    "trajectory.started": _needs_trajectory(_trajectory_started),
    "tests.ran": _needs_trajectory(_tests_ran),
    "trajectory.finished": _needs_trajectory(_trajectory_finished),
    "turn.generated": _needs_trajectory(_turn_generated),
    "tool.executed": _needs_trajectory(_tool_executed),
    "sandbox.requested": _needs_trajectory(_sandbox),
    "sandbox.ready": _needs_trajectory(_sandbox),
    "sandbox.failed": _needs_trajectory(_sandbox),
    "sandbox.released": _needs_trajectory(_sandbox),
    "weights.published": _weights_published,
    "trainer.step": _trainer_step,
}
