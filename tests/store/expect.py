"""Assertions that a store holds exactly a list of events and the projections they determine.

The expectations are computed here from the events directly (not through
`streams.store.rows`), so a wrong projection fails these checks.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from sqlalchemy import Engine, text

from streams.events import Event
from streams.payloads import (
    SandboxFailed,
    TestsRan,
    ToolExecuted,
    TrainerStep,
    TrajectoryFinished,
    TrajectoryStarted,
    TurnGenerated,
    WeightsPublished,
)
from streams.store import event_from_row


def rows(engine: Engine, sql: str) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(sql)))


def scalar(engine: Engine, sql: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql)).scalar_one()


def as_json(value: Any) -> Any:
    """A JSON column read with plain SQL: text on SQLite, already decoded on PostgreSQL."""
    return json.loads(value) if isinstance(value, str) else value


def assert_events_stored(engine: Engine, events: list[Event]) -> None:
    """`events` holds exactly these events, every column round-tripping, each at one unique position."""
    stored = rows(engine, "SELECT * FROM events")
    assert len(stored) == len(events), f"{len(stored)} rows for {len(events)} events"
    by_id = {str(event.id): event for event in events}
    for row in stored:
        assert event_from_row(row) == by_id[row.id]
    positions = {(row.kafka_topic, row.kafka_partition, row.kafka_offset) for row in stored}
    assert len(positions) == len(stored)


def assert_projections(engine: Engine, events: list[Event]) -> None:
    """Every projection agrees with what the events say."""
    of_type: dict[type, list[Event]] = {}
    for event in events:
        of_type.setdefault(type(event.data), []).append(event)
    _check_trajectories(engine, of_type)
    _check_turns_and_tools(engine, of_type)
    _check_sandboxes(engine, events, of_type)
    _check_training(engine, of_type)


def _check_trajectories(engine: Engine, of_type: dict[type, list[Event]]) -> None:
    table = {row.trajectory_id: row for row in rows(engine, "SELECT * FROM trajectories")}
    ids = {
        e.trajectory_id for t in (TrajectoryStarted, TestsRan, TrajectoryFinished) for e in of_type.get(t, [])
    }
    assert set(table) == ids
    first_token = {  # a trajectory's weight version: its first generated token's
        e.trajectory_id: e.data.output_versions[0] if len(e.data.output_versions) else e.data.weight_version
        for e in of_type.get(TurnGenerated, [])
        if isinstance(e.data, TurnGenerated) and e.data.turn == 1
    }
    assert {tid: row.start_policy_version for tid, row in table.items()} == {
        tid: first_token.get(tid) for tid in table
    }
    for event in of_type.get(TrajectoryStarted, []):
        row, data = table[event.trajectory_id], event.data
        assert isinstance(data, TrajectoryStarted)
        assert (row.attempt, row.group_size, row.started_ns) == (data.attempt, data.group_size, event.time_ns)
        assert row.prompt_tokens == len(data.prompt_token_ids)
        assert as_json(row.limits) == data.limits.model_dump()
    for event in of_type.get(TestsRan, []):
        row, data = table[event.trajectory_id], event.data
        assert isinstance(data, TestsRan)
        assert row.tests_reward == data.reward
        assert row.fail_to_pass_passed == sum(data.fail_to_pass.values())
        assert row.pass_to_pass_total == len(data.pass_to_pass)
    for event in of_type.get(TrajectoryFinished, []):
        row, data = table[event.trajectory_id], event.data
        assert isinstance(data, TrajectoryFinished)
        assert (row.outcome, row.reward, row.turns) == (data.outcome.value, data.reward, data.turns)
        assert (row.generated_tokens, row.last_seq, row.error) == (
            data.generated_tokens,
            data.last_seq,
            data.error,
        )
        assert (row.finished_ns, row.llm_s, row.total_s) == (
            event.time_ns,
            data.times.llm_s,
            data.times.total_s,
        )
        assert row.run_id == event.run_id and row.group_id == event.group_id and row.task_id == event.task_id
        assert row.end_policy_version == event.policy_version


def _check_turns_and_tools(engine: Engine, of_type: dict[type, list[Event]]) -> None:
    turns = {(r.trajectory_id, r.turn): r for r in rows(engine, "SELECT * FROM turns")}
    generated = of_type.get(TurnGenerated, [])
    assert len(turns) == len(generated)
    for event in generated:
        data = event.data
        assert isinstance(data, TurnGenerated)
        row = turns[(event.trajectory_id, data.turn)]
        assert (row.output_tokens, row.observation_tokens) == (
            len(data.output_token_ids),
            len(data.observation_token_ids),
        )
        assert (row.engine_id, row.finish_reason, row.latency_s) == (
            data.engine_id,
            data.finish_reason,
            data.latency_s,
        )
        assert row.oldest_output_version == min(data.output_versions)
        assert row.event_id == str(event.id)
    tools = {r.event_id: r for r in rows(engine, "SELECT * FROM tool_calls")}
    executed = of_type.get(ToolExecuted, [])
    assert len(tools) == len(executed)
    for event in executed:
        data = event.data
        assert isinstance(data, ToolExecuted)
        row = tools[str(event.id)]
        assert (row.command, row.exit_code, row.output_chars) == (
            data.command,
            data.exit_code,
            len(data.output),
        )
        assert (bool(row.timed_out), bool(row.truncated)) == (data.timed_out, data.truncated)


def _check_sandboxes(engine: Engine, events: list[Event], of_type: dict[type, list[Event]]) -> None:
    table = {row.trajectory_id: row for row in rows(engine, "SELECT * FROM sandbox_lifecycle")}
    assert set(table) == {e.trajectory_id for e in events if e.type.startswith("sandbox.")}
    kinds = Counter(r.error_kind for r in table.values() if r.error_kind)
    failed = of_type.get(SandboxFailed, [])
    assert kinds == Counter(e.data.error_kind for e in failed if isinstance(e.data, SandboxFailed))
    for event in events:
        row = table.get(event.trajectory_id or "")
        if event.type == "sandbox.ready":
            assert row is not None and row.ready_ns == event.time_ns and row.sandbox_id is not None
        if event.type == "sandbox.released":
            assert row is not None and row.released_ns == event.time_ns and row.lifetime_s is not None


def _check_training(engine: Engine, of_type: dict[type, list[Event]]) -> None:
    versions = {r.version: r for r in rows(engine, "SELECT * FROM weight_versions")}
    published = of_type.get(WeightsPublished, [])
    assert len(versions) == len(published)
    for event in published:
        assert isinstance(event.data, WeightsPublished)
        assert versions[event.data.version].path == event.data.path
    steps = {r.step: r for r in rows(engine, "SELECT * FROM trainer_steps")}
    trained = of_type.get(TrainerStep, [])
    assert len(steps) == len(trained)
    for event in trained:
        data = event.data
        assert isinstance(data, TrainerStep)
        row = steps[data.step]
        assert (row.loss, row.grad_norm, row.ess, as_json(row.times)) == (
            data.loss,
            data.grad_norm,
            data.ess,
            data.times.model_dump(),
        )
