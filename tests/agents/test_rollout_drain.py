"""The rollout worker process draining (see test_rollout_worker.py for the setup): a worker given
SIGTERM (to its process alone, as the supervisor sends it) drains: episodes in flight finish
within `rollout.drain_timeout_s` and are committed (a new worker does not re-run them), no request
written after the signal is taken; with a tiny drain timeout the unfinished ones stay uncommitted
and a new worker re-runs them under the same ids; requests finished but not committed are not
run again by the next worker.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from agents.settings import RolloutSettings
from agents.submit import TaskRef
from rollstream.config import Config
from rollstream.supervisor_settings import SupervisorSettings
from streams.payloads import Limits
from tests.agents.rollout_worker_process import (
    Worker,
    by_trajectory,
    check_incarnations,
    committed,
    finished_ids,
    read_events,
    started_ids,
    submit,
    terminate,
    turned_ids,
    wait_until,
)

pytestmark = pytest.mark.slow


def test_default_drain_fits_inside_the_supervisors_stop_window() -> None:
    window = SupervisorSettings().stop_timeout_s
    assert RolloutSettings().drain_timeout_s <= window - 3.0  # time left to commit and leave the group


def test_sigterm_lets_in_flight_episodes_finish_and_commits_them(
    kafka_config: Config, one_task_root: Path, engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    task_dir = next(one_task_root.iterdir()).name
    task = TaskRef(task_dir, task_dir)
    limits = Limits(max_turns=4, max_new_tokens_per_turn=16, context_cap=4096)
    drained = set(submit(kafka_config, "run-d", task, 0, 2, limits))
    log = tmp_path / "worker.log"
    options = ("agent.max_format_errors=1000", "rollout.drain_timeout_s=120")
    first = Worker(kafka_config, one_task_root, engine_url, model_dir, log, *options)
    try:
        wait_until(lambda: drained <= turned_ids(read_events(kafka_config)), "every episode's first turn")
        at_signal = read_events(kafka_config)
        exit_s = terminate(first)
    finally:
        first.kill()
    in_flight = drained - finished_ids(at_signal)
    assert in_flight, "every episode finished before the signal: make them longer"
    later = set(submit(kafka_config, "run-d", task, 1, 1, limits))  # written while it drains or after
    events = read_events(kafka_config)
    assert drained <= finished_ids(events), f"in-flight episodes unfinished after the drain ({exit_s:.1f}s)"
    assert not later & started_ids(events), "a request written after SIGTERM was taken"
    source = {e.source for e in events if e.trajectory_id in drained}
    assert len(source) == 1, source

    second = Worker(kafka_config, one_task_root, engine_url, model_dir, log, *options)
    try:
        wait_until(lambda: later <= finished_ids(read_events(kafka_config)), "the later requests to finish")
    finally:
        second.kill(signal.SIGTERM)
    runs = by_trajectory(read_events(kafka_config))
    for trajectory in drained:  # committed: the new worker did not run them again
        assert [e.type for e in runs[trajectory]].count("trajectory.started") == 1, trajectory
        assert {e.source for e in runs[trajectory]} == source
    assert all(source.isdisjoint(e.source for e in runs[t]) for t in later)  # run by the new worker


def test_episodes_unfinished_at_the_drain_timeout_are_rerun_under_the_same_ids(
    kafka_config: Config, one_task_root: Path, engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    task_dir = next(one_task_root.iterdir()).name
    limits = Limits(max_turns=6, max_new_tokens_per_turn=16, context_cap=4096)
    expected = set(submit(kafka_config, "run-t", TaskRef(task_dir, task_dir), 0, 2, limits))
    log = tmp_path / "worker.log"
    first = Worker(
        kafka_config,
        one_task_root,
        engine_url,
        model_dir,
        log,
        "agent.max_format_errors=1000",
        "rollout.drain_timeout_s=0.2",
    )
    try:
        wait_until(lambda: expected <= turned_ids(read_events(kafka_config)), "every episode's first turn")
        terminate(first)
    finally:
        first.kill()
    events = read_events(kafka_config)
    first_source = next(e.source for e in events if e.trajectory_id in expected)
    unfinished = expected - finished_ids(events)
    assert unfinished, "every episode finished within 0.2 s of the signal: make them longer"

    second = Worker(kafka_config, one_task_root, engine_url, model_dir, log, "agent.max_format_errors=1000")
    try:
        wait_until(lambda: expected <= finished_ids(read_events(kafka_config)), "every request to finish")
    finally:
        second.kill(signal.SIGTERM)
    runs = by_trajectory(read_events(kafka_config))
    for trajectory in unfinished:  # not committed: re-run by the new worker, under the same ids
        own = runs[trajectory]
        sources = {e.source for e in own}
        assert first_source in sources and len(sources) == 2, sources
        started = [e.id for e in own if e.type == "trajectory.started"]
        assert len(started) == 2 and len(set(started)) == 1, "the re-run wrote another trajectory.started id"
        finishing = {e.source for e in own if e.type == "trajectory.finished"}
        assert first_source not in finishing
        check_incarnations(own)


def test_requests_finished_but_uncommitted_are_not_run_again_by_the_next_worker(
    kafka_config: Config, one_task_root: Path, engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    """Killed after its episodes finished but before any commit: the next owner reads their
    `trajectory.finished` from the log and does not run them a second time."""
    task_dir = next(one_task_root.iterdir()).name
    task = TaskRef(task_dir, task_dir)
    limits = Limits(max_turns=2, max_new_tokens_per_turn=16, context_cap=4096)
    done = set(submit(kafka_config, "run-f", task, 0, 3, limits))
    log = tmp_path / "worker.log"
    first = Worker(kafka_config, one_task_root, engine_url, model_dir, log, "rollout.commit_interval_s=3600")
    try:
        wait_until(lambda: done <= finished_ids(read_events(kafka_config)), "every episode to finish")
    finally:
        first.kill(signal.SIGKILL)  # nothing committed: every request is handed to the next worker
    source = {e.source for e in read_events(kafka_config) if e.trajectory_id in done}
    later = set(submit(kafka_config, "run-f", task, 1, 1, limits))
    second = Worker(kafka_config, one_task_root, engine_url, model_dir, log)
    try:
        wait_until(lambda: later <= finished_ids(read_events(kafka_config)), "the later request to finish")
        wait_until(lambda: committed(kafka_config) >= len(done) + len(later), "every request committed")
    finally:
        second.kill(signal.SIGTERM)
    runs = by_trajectory(read_events(kafka_config))
    for trajectory in done:
        assert [e.type for e in runs[trajectory]].count("trajectory.finished") == 1, trajectory
        assert {e.source for e in runs[trajectory]} == source, "run again by the second worker"
    assert all(source.isdisjoint(e.source for e in runs[t]) for t in later)
