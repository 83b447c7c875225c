"""The report's pure figure functions, its "no data" drawing, and the ready-made SQL of docs/store.md
(the exact strings, run through `rollstream sql` on SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from rollstream.commands.sql import command as sql_command
from rollstream.report.figures import cap_waits, long_tail, pass1_by_version, trajectory_time, turns_histogram
from rollstream.report.page import figure_html
from rollstream.report.plots import plot
from rollstream.report.queries import PASS1_BY_VERSION_SQL, ROLLOUT_TIME_SQL, TimeRow, VersionRow
from rollstream.report.settings import ReportSettings
from streams.tail import finished_mark
from tests.report.run_events import EVAL, TRAIN, eval_run, expected_pass1, training_run
from tests.store.batches import positioned, write_in_batches

STORE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "store.md"
PNG = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()
sql_app = typer.Typer()
sql_app.command()(sql_command)


def test_pass1_counts_scored_attempts_only() -> None:
    figure = pass1_by_version(
        [VersionRow(0, 4, 1, 2, 0.25), VersionRow(1, 4, 3, 0, 0.75), VersionRow(2, 0, 0, 3, None)]
    )
    pass1, reward = figure.series
    assert (pass1.x, pass1.y) == ([0.0, 1.0], [0.25, 0.75])  # version 2 had only infra errors: no point
    assert reward.y == [0.25, 0.75] and figure.points == 2
    assert figure.notes == ["8 scored attempts; 5 infrastructure errors not scored"]


def test_long_tail_marks_where_the_fraction_had_finished() -> None:
    spans = [(0, int(end * 1e9)) for end in (1, 2, 3, 4, 5, 6, 7, 8, 9, 30)]
    figure = long_tail(spans, ReportSettings())
    assert figure.marks[0][1] == finished_mark([float(e) for e in (1, 2, 3, 4, 5, 6, 7, 8, 9, 30)]) == 9.0
    assert figure.notes[0].startswith("70.0% of rollout wall time")  # (30 - 9) / 30
    assert figure.series[0].y[-1] == 1.0 and figure.points == 10


def test_turns_get_wider_bins_beyond_the_cap_and_waits_bin_evenly() -> None:
    figure = turns_histogram([(t, 1) for t in range(1, 101)], ReportSettings(max_turn_bins=10))
    assert figure.bin_width == 10 and len(figure.series[0].y) <= 11 and sum(figure.series[0].y) == 100
    waits = cap_waits([0.0, 0.1, 0.2, 5.0], ReportSettings(wait_bins=5))
    assert sum(waits.series[0].y) == 4 and waits.points == 4 and "max 5.000 s" in waits.notes[0]
    same = cap_waits([0.3, 0.3], ReportSettings())  # zero spread still gets a bar
    assert same.series[0].y == [2.0]


def test_time_breakdown_keeps_other_time_and_skips_untimed_rows() -> None:
    parts = {
        "llm_s": 6.0,
        "tool_s": 2.0,
        "sandbox_start_s": 0.5,
        "agent_install_s": 0.0,
        "tests_s": 0.5,
        "queue_s": 0.0,
    }
    untimed = dict.fromkeys(parts, 0.0)
    figure = trajectory_time([TimeRow("resolved", 3, parts, 10.0), TimeRow("unresolved", 2, untimed, 0.0)])
    assert figure.categories == ["resolved"] and figure.points == 3
    assert next(s for s in figure.series if s.label.startswith("other")).y == [1.0]
    assert "llm 60%" in figure.notes[0]


def test_a_figure_without_data_is_a_no_data_panel(tmp_path: Path) -> None:
    figure = trajectory_time([])
    assert figure.points == 0
    assert plot(figure, tmp_path / "empty.png", ReportSettings()).read_bytes()[:8] == PNG
    html = figure_html(figure, "empty.png")
    assert 'data-points="0" data-empty="true"' in html and "no data: no trajectory" in html


def test_documented_sql_answers_pass1_by_version_and_rollout_time(db_url: str) -> None:
    page = STORE_PAGE.read_text()
    assert PASS1_BY_VERSION_SQL in page and ROLLOUT_TIME_SQL in page  # docs/store.md quotes these strings
    train = training_run(TRAIN)
    write_in_batches(db_url, positioned(train + eval_run(EVAL)))

    pass1 = sql(PASS1_BY_VERSION_SQL, db_url)
    assert {r["version"]: float(r["pass1"]) for r in pass1 if r["run_id"] == TRAIN} == expected_pass1(train)
    assert [r["version"] for r in pass1 if r["run_id"] == EVAL] == [5]

    times = {r["run_id"]: r for r in sql(ROLLOUT_TIME_SQL, db_url)}
    finished = [e.data for e in train if e.type == "trajectory.finished"]
    total = sum(d.times.total_s for d in finished)  # type: ignore[attr-defined]
    llm = sum(d.times.llm_s for d in finished) / total  # type: ignore[attr-defined]
    assert set(times) == {TRAIN, EVAL} and abs(float(times[TRAIN]["llm"]) - llm) < 1e-9
    shares = sum(
        float(times[TRAIN][k]) for k in ("llm", "tools", "sandbox_start", "agent_install", "tests", "queue")
    )
    assert 0.9 < shares <= 1.0 + 1e-9


def sql(statement: str, url: str) -> list[dict[str, object]]:
    result = runner.invoke(sql_app, [statement, "--db", url, "--format", "json"])
    assert result.exit_code == 0, result.output
    return list(json.loads(result.output))


def test_the_runs_evaluations_are_shown_with_their_standard_errors(db_url: str) -> None:
    """`<run>-eval-<name>` runs in the store are the run's held-out evaluations: one bar each, its pass@1
    the mean over tasks of each task's success rate, its error bar the standard error over tasks."""
    from rollstream.report.figures import heldout_pass1
    from rollstream.report.queries import evaluation_rows
    from streams.store import open_readonly

    before, after = eval_run(f"{TRAIN}-eval-sft", version=1, seed=3), eval_run(f"{TRAIN}-eval-rl", version=9)
    write_in_batches(db_url, positioned(training_run(TRAIN) + before + after + eval_run(EVAL)))
    with open_readonly(db_url).connect() as conn:
        rows = evaluation_rows(conn, TRAIN)
    assert {r.name for r in rows} == {"sft", "rl"}  # not `eval-run`, another run's evaluation
    figure = heldout_pass1(rows)
    assert figure.categories == ["sft (v1)", "rl (v9)"]
    for events, value, error in zip(
        (before, after), figure.series[0].y, figure.series[0].errors, strict=True
    ):
        per_task = task_success(events)
        assert abs(value - sum(per_task) / len(per_task)) < 1e-12
        assert error > 0 or len(set(per_task)) == 1
    assert heldout_pass1([]).points == 0


def task_success(events: list) -> list[float]:
    """Each task's success rate over its scored attempts, from the events (infra errors unscored)."""
    from collections import defaultdict

    attempts: dict[str, list[bool]] = defaultdict(list)
    for event in events:
        if event.type == "trajectory.finished" and not str(event.data.outcome).startswith("infra_error"):
            attempts[event.task_id].append(str(event.data.outcome) == "resolved")
    return [sum(v) / len(v) for v in attempts.values()]
