"""`finished_outcomes`: the first finish of each trajectory, nothing from other events."""

from __future__ import annotations

from agents.finished_log import FINISHED_MARKER, finished_outcomes
from streams.events import Event, encode_event, make_event
from streams.outcomes import Outcome
from streams.payloads import TrajectoryFinished


def finish(trajectory: str, outcome: Outcome, seq: int) -> Event:
    data = TrajectoryFinished(
        outcome=outcome,
        reward=None if outcome.is_infra_error else 0.0,
        turns=1,
        generated_tokens=3,
        context_tokens=9,
        last_seq=seq,
    )
    return make_event(
        data, run_id="r", seq=seq, time_ns=1, source="w", group_id="g", trajectory_id=trajectory
    )


def test_first_finish_of_each_trajectory_wins() -> None:
    events = [
        finish("a", Outcome.INFRA_SANDBOX_START, 2),
        finish("b", Outcome.RESOLVED, 5),
        finish("a", Outcome.UNRESOLVED, 7),  # a second, different record: the first one counts
    ]
    assert finished_outcomes(events) == {"a": Outcome.INFRA_SANDBOX_START, "b": Outcome.RESOLVED}


def test_the_marker_is_in_every_finished_record() -> None:
    assert FINISHED_MARKER in encode_event(finish("a", Outcome.RESOLVED, 1))
