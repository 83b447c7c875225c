"""The run report: spans from events, PNG plots and the HTML page."""

from __future__ import annotations

from pathlib import Path

from rollstream.report.events import spans_from_events, write_report
from streams.events import make_event
from streams.outcomes import Outcome
from streams.payloads import Limits, TrajectoryFinished, TrajectoryStarted


def events_for(tid: str, start_s: float, end_s: float, outcome: Outcome, turns: int) -> list:
    started = TrajectoryStarted(attempt=0, group_size=2, limits=Limits())
    done = TrajectoryFinished(
        outcome=outcome,
        reward=None if outcome.is_infra_error else 0.0,
        turns=turns,
        generated_tokens=10,
        context_tokens=20,
        last_seq=1,
    )
    common = {"run_id": "r", "source": "w", "trajectory_id": tid, "group_id": "g"}
    return [
        make_event(started, seq=0, time_ns=int(start_s * 1e9), **common),
        make_event(done, seq=1, time_ns=int(end_s * 1e9), **common),
    ]


def test_spans_are_relative_to_the_first_start_and_skip_unfinished() -> None:
    events = [
        *events_for("a", 10.0, 12.5, Outcome.RESOLVED, 3),
        *events_for("b", 11.0, 20.0, Outcome.TRUNCATED_TURNS, 8),
        events_for("c", 11.5, 30.0, Outcome.RESOLVED, 2)[0],  # still running
    ]
    spans = spans_from_events(events)
    assert [(s.trajectory_id, s.start_s, s.end_s) for s in spans] == [("a", 0.0, 2.5), ("b", 1.0, 10.0)]
    assert spans[1].outcome == "truncated:turns" and spans[1].turns == 8


def test_report_writes_plots_and_page(tmp_path: Path) -> None:
    events = [
        *events_for("a", 0.0, 2.0, Outcome.RESOLVED, 3),
        *events_for("b", 0.5, 9.0, Outcome.INFRA_SANDBOX_START, 0),
    ]
    page = write_report(tmp_path, "run-<1>", events, {"Tail": {"tail share": 0.12}})
    for name in ("timeline.png", "outcomes.png", "turns.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text()
    assert "run-&lt;1&gt;" in text and "tail share" in text and "2 trajectories finished" in text
