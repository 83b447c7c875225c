"""The rollout worker process end to end: real Kafka, the embedded engine serving a tiny model
from `rollstream model init`, bwrap sandboxes and a default task.

- episodes through `rollstream rollout` read back from Kafka: seq gap-free, every event type,
  token arrays that fold and that the engine reproduces, outcome/reward equal the verifier's;
- abort records on `rollout.control` end episodes as `truncated:deadline` (before and while
  they run);
- a worker killed with SIGKILL mid-run and restarted: every request finishes and re-run
  events carry the same ids (no id maps to two trajectories' worth of content);
- draining on SIGTERM: test_rollout_drain.py.
"""

from __future__ import annotations

import asyncio
import base64
import signal
import subprocess
from pathlib import Path

import pytest

from agents.identity import group_id
from agents.submit import TaskRef
from rollstream.config import Config
from streams.assemble import fold_trajectory
from streams.bus import read_topic
from streams.events import ROLLOUT_EVENT_TYPES, Event, decode_event
from streams.outcomes import Outcome
from streams.payloads import DeadLetterRecord, Limits
from tests.agents.rollout_worker_process import (
    ROLLOUT_CLI,
    Worker,
    by_trajectory,
    check_incarnations,
    finished_ids,
    read_events,
    run_killed_and_rerun,
    submit,
    wait_until,
    write_abort,
)
from trainer.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow


def test_episodes_through_the_worker_process_and_kafka(
    kafka_config: Config, one_task_root: Path, engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    task_dir = next(one_task_root.iterdir()).name
    task = TaskRef(task_dir, task_dir)
    short = Limits(max_turns=2, max_new_tokens_per_turn=16, context_cap=4096)
    long = Limits(max_turns=500, max_new_tokens_per_turn=16, context_cap=4096)
    normal = submit(kafka_config, "run-a", task, 0, 1, short)
    running, early = submit(kafka_config, "run-a", task, 1, 2, long)
    write_abort(kafka_config, "run-a", [early])  # aborted before any worker picks it up
    unservable = submit(kafka_config, "run-a", TaskRef("no-such-task", "no-such-task"), 2, 1, short)
    worker = Worker(
        kafka_config,
        one_task_root,
        engine_url,
        model_dir,
        tmp_path / "worker.log",
        "agent.max_format_errors=1000",
    )
    try:

        def first_turn() -> bool:
            events = read_events(kafka_config)
            return any(e.trajectory_id == running and e.type == "turn.generated" for e in events)

        wait_until(first_turn, "the long episode's first turn")
        write_abort(kafka_config, "run-a", [running])
        expected = {*normal, running, early}
        wait_until(lambda: expected <= finished_ids(read_events(kafka_config)), "every episode to finish")
    finally:
        worker.kill(signal.SIGTERM)
    check_dead_lettered_request(kafka_config, unservable[0])
    trajectories = by_trajectory(read_events(kafka_config))
    check_normal_episode(trajectories[normal[0]], model_dir)
    for aborted in (running, early):
        finished = trajectories[aborted][-1].data
        assert finished.outcome == Outcome.TRUNCATED_DEADLINE and finished.reward == 0.0, finished
    assert [e.type for e in trajectories[early]] == ["trajectory.started", "trajectory.finished"]
    assert "tests.ran" not in {e.type for e in trajectories[running]}


def check_dead_lettered_request(config: Config, trajectory_id: str) -> None:
    """A request naming a task the worker does not have is in `deadletter`, whole, with the reason."""
    consumed = asyncio.run(read_topic(config.kafka, config.topics, "deadletter", idle_s=0.5))
    letters = [c.event.data for c in consumed if isinstance(c.event.data, DeadLetterRecord)]
    assert len(letters) == 1, letters
    letter = letters[0]
    assert "no-such-task" in letter.reason and letter.topic.endswith("rollout.requests")
    request = decode_event(base64.b64decode(letter.value_b64))
    assert request.trajectory_id == trajectory_id and request.type == "rollout.requested"
    assert trajectory_id not in finished_ids(read_events(config))  # not run, not scored


def check_normal_episode(events: list[Event], model_dir: Path) -> None:
    events = sorted(events, key=lambda e: e.seq)
    assert [e.seq for e in events] == list(range(len(events))), "seq must be gap-free from 0"
    expected_types = set(ROLLOUT_EVENT_TYPES) - {"sandbox.failed"}
    assert {e.type for e in events} == expected_types
    folded = fold_trajectory(events)
    finished = events[-1].data
    tests = next(e.data for e in events if e.type == "tests.ran")
    assert finished.outcome == Outcome.TRUNCATED_TURNS and finished.reward == tests.reward
    assert folded.reward == tests.reward and folded.turns == finished.turns == 2
    turns = [e.data for e in events if e.type == "turn.generated"]
    assert sum(len(t.output_token_ids) for t in turns) == finished.generated_tokens == sum(folded.loss_mask)
    assert len(folded.token_ids) == turns[-1].context_tokens
    vocab = load_tokenizer(model_dir).get_vocab_size()
    for turn in turns:
        assert 0 < len(turn.output_token_ids) <= 16 and all(0 <= t < vocab for t in turn.output_token_ids)
        assert all(lp <= 0.0 for lp in turn.output_logprobs)
    # what the engine received and produced is the folded array: a full forward pass of the same
    # weights over it gives each output token the engine's logprob, and greedy picked the best
    check_against_forward_pass(folded.token_ids, folded.loss_mask, folded.rollout_logprobs, model_dir)


def check_against_forward_pass(
    tokens: list[int], mask: list[int], logprobs: list[float], model_dir: Path
) -> None:
    import torch

    from trainer.checkpoint import load_model

    with torch.no_grad():
        logits = load_model(model_dir)(torch.tensor([tokens]))[0].float()
    predicted = torch.log_softmax(logits[:-1], dim=-1)  # row i predicts token i + 1
    for i in range(1, len(tokens)):
        if mask[i]:
            row = predicted[i - 1]
            assert float(row[tokens[i]]) == pytest.approx(logprobs[i], abs=1e-3), f"token {i}"
            assert float(row.max() - row[tokens[i]]) < 1e-3, f"greedy token {i} is not the argmax"


def test_killed_worker_leaves_requests_to_rerun_with_the_same_ids(
    kafka_config: Config, one_task_root: Path, engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    expected = run_killed_and_rerun(kafka_config, one_task_root, engine_url, model_dir, log, "run-k", 4)
    events = read_events(kafka_config)
    started = [e.id for e in events if e.type == "trajectory.started"]
    assert len(started) > len(set(started)), "the killed worker's requests were re-run under the same ids"
    slots: dict[object, tuple[str | None, int]] = {}
    for event in events:  # downstream deduplication by id is sound: an id names one (trajectory, seq)
        slot = (event.trajectory_id, event.seq)
        assert slots.setdefault(event.id, slot) == slot
    for trajectory, own in by_trajectory(events).items():
        assert trajectory in expected
        check_incarnations(own)


def test_submit_command_writes_group_size_requests_per_task_with_stable_ids(
    kafka_config: Config, one_task_root: Path
) -> None:
    kafka, topics = kafka_config.kafka, kafka_config.topics
    sets = [f'kafka.bootstrap="{kafka.bootstrap}"', f'topics.prefix="{topics.prefix}"']
    args = [*ROLLOUT_CLI, "submit", "--tasks", str(one_task_root), "--group-size", "3", "--run", "run-s"]
    for _ in range(2):  # submitting the same run twice writes the same ids
        subprocess.run([*args, *[a for s in sets for a in ("-s", s)]], check=True, capture_output=True)
    consumed = asyncio.run(read_topic(kafka, topics, "rollout.requests", idle_s=0.5))
    requests = [c.event for c in consumed]
    assert len(requests) == 6 and len({e.id for e in requests}) == 3
    assert {e.data.attempt for e in requests} == {0, 1, 2} and {e.group_id for e in requests} == {
        group_id("run-s", next(one_task_root.iterdir()).name, 0)
    }
    assert all(e.data.limits.max_turns == kafka_config.policy.max_turns for e in requests)
