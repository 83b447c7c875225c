"""Folding one trajectory: order, duplicates, gaps, malformed events, token layout."""

from __future__ import annotations

import random

import pytest

from streams.assemble import MalformedTrajectory, Pending, Trajectory, check_event, fold_trajectory
from streams.eventgen import AttemptSpec, trajectory_events
from streams.outcomes import Outcome
from streams.payloads import TurnGenerated


def _events(turns: int = 3, **kw: object) -> list:
    return trajectory_events("run", "run/g0", AttemptSpec(0, turns=turns, **kw))  # type: ignore[arg-type]


def test_fold_lays_out_prompt_observations_and_outputs() -> None:
    events = _events(turns=3, output_tokens=5, observation_tokens=4, version=7)
    trajectory = fold_trajectory(events)
    assert isinstance(trajectory, Trajectory)
    assert trajectory.turns == 3 and trajectory.prompt_tokens == 12
    assert trajectory.generated_tokens == 15
    assert trajectory.context_tokens == 12 + 15 + 2 * 4 == len(trajectory.token_ids)
    assert len(trajectory.loss_mask) == len(trajectory.rollout_logprobs) == len(trajectory.token_versions)
    turns = [e.data for e in events if isinstance(e.data, TurnGenerated)]
    expected_ids = list(events[0].data.prompt_token_ids)
    for turn in turns:
        expected_ids += turn.observation_token_ids + turn.output_token_ids
    assert trajectory.token_ids.tolist() == expected_ids
    # mask 1 exactly on output tokens, with their logprobs and versions; 0 / -1 elsewhere
    for i, mask in enumerate(trajectory.loss_mask):
        if mask:
            assert trajectory.token_versions[i] == 7 and trajectory.rollout_logprobs[i] < 0
        else:
            assert trajectory.token_versions[i] == -1 and trajectory.rollout_logprobs[i] == 0.0
    assert trajectory.outcome == Outcome.RESOLVED and trajectory.reward == 1.0
    assert trajectory.times.llm_s == pytest.approx(3 * 0.7) and trajectory.times.tool_s == pytest.approx(0.9)
    assert trajectory.times.sandbox_start_s == pytest.approx(0.4)
    assert trajectory.times.total_s == pytest.approx(trajectory.duration_s)
    assert trajectory.turn_records[1].command == "ls step2"


def test_out_of_order_and_duplicated_events_fold_the_same() -> None:
    events = _events(turns=4)
    expected = fold_trajectory(events)
    shuffled = events + events[2:6]
    random.Random(1).shuffle(shuffled)
    assert fold_trajectory(shuffled) == expected


def test_a_gap_waits_for_the_missing_event() -> None:
    events = _events(turns=3)
    missing = events[4]
    pending = fold_trajectory([e for e in events if e is not missing])
    assert isinstance(pending, Pending)
    assert pending.missing == (missing.seq,) and "waiting for seq" in pending.reason
    unfinished = fold_trajectory(events[:-1])
    assert isinstance(unfinished, Pending) and unfinished.last_seq is None


def test_infra_error_is_never_scored() -> None:
    events = _events(turns=0, outcome=Outcome.INFRA_SANDBOX_START, reward=None)
    trajectory = fold_trajectory(events)
    assert isinstance(trajectory, Trajectory)
    assert trajectory.reward is None and not trajectory.is_scored and trajectory.generated_tokens == 0


def test_malformed_events_are_named() -> None:
    events = _events(turns=2)
    turn = events[3]
    assert isinstance(turn.data, TurnGenerated)
    bad_turn = turn.model_copy(update={"data": turn.data.model_copy(update={"output_logprobs": [0.0]})})
    assert "logprobs" in (check_event(bad_turn) or "")
    with pytest.raises(MalformedTrajectory, match="logprobs"):
        fold_trajectory([bad_turn if e is turn else e for e in events])
    other = events[2].model_copy(update={"trajectory_id": "someone-else"})
    with pytest.raises(MalformedTrajectory, match="belongs to"):
        fold_trajectory([other if e is events[2] else e for e in events])
    conflicting = events[2].model_copy(update={"id": events[3].id})
    with pytest.raises(MalformedTrajectory, match="two different events"):
        fold_trajectory([*events, conflicting])


def test_a_killed_runs_partial_copy_never_mixes_with_the_rerun() -> None:
    """Same ids, different samples: the worker that finished the trajectory wins at every seq,
    and the killed run's events past the re-run's end are dropped."""
    killed = _events(turns=5, output_tokens=6, version=1)[:-3]  # died before finishing, longer so far
    killed = [e for e in killed if e.type != "trajectory.finished"]
    rerun = trajectory_events(
        "run", "run/g0", AttemptSpec(0, turns=2, output_tokens=3, version=2), source="rollout-1"
    )
    alone = fold_trajectory(rerun)
    assert max(e.seq for e in killed) > max(e.seq for e in rerun)
    for order in (killed + rerun, rerun + killed):
        folded = fold_trajectory(order)
        assert folded == alone
        assert set(folded.token_versions) <= {-1, 2}  # nothing sampled by the killed run
