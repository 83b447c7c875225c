"""The run report end to end: events produced to real Kafka, sunk by the real `rollstream sink` into
SQLite and PostgreSQL, the report written by the demo's end (`summarise_run`) and by
`rollstream report RUN`, and loaded in Debian's headless Chromium.

The browser must decode every image with a non-zero size and see every figure drawn (no
`data-points="0"`) for a training run that has all the data; an eval-only run's trainer and
infra-error figures must say "no data" instead. The figures must agree with figures computed
from the events themselves (pass@1 by version, the tail share of `streams.tail`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rollstream.commands.report import command as report_command
from rollstream.config import Config
from rollstream.report.build import load_rows
from rollstream.report.figures import figures
from rollstream.report.settings import ReportSettings
from rollstream.run_summary import summarise_run
from streams.events import Event
from streams.replay import by_trajectory, fold_episodes
from streams.tail import tail_figures
from tests.report.browser import chromium_path, inspect_page
from tests.report.run_events import EVAL, TRAIN, eval_run, expected_pass1, training_run
from tests.store.sinkrun import produce, run_sink_until_idle

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / ".rollstream" / "test-artifacts" / "report"
FIGURES = {
    "pass1_by_version",
    "heldout_pass1",
    "outcomes",
    "turns",
    "long_tail",
    "trajectory_time",
    "step_time",
    "stability",
    "infra_errors",
    "cap_waits",
}
EVAL_EMPTY = {"step_time", "stability", "infra_errors", "heldout_pass1"}

runner = CliRunner()
app = typer.Typer()
app.command()(report_command)


def report(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


@pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed: run scripts/setup_system.sh")
def test_report_from_the_store_renders_in_chromium(
    db_url: str, config_factory: Callable[..., Config], tmp_path: Path
) -> None:
    config = config_factory(f'db.url="{db_url}"')
    train, evaluation = training_run(TRAIN), eval_run(EVAL)
    held_out = eval_run(f"{TRAIN}-eval-base", version=0, seed=5) + eval_run(f"{TRAIN}-eval-rl", version=4)
    produce(config, train + evaluation + held_out)
    run_sink_until_idle(config, db_url, tmp_path / "sink.log")
    backend = db_url.split(":", 1)[0].split("+", 1)[0]
    check_figures_match_the_events(db_url, train)
    page = summarise_run(config, TRAIN, tmp_path / "train")  # the demo's end writes this report
    check_training_page(page, ARTIFACTS / f"train-{backend}.png")
    check_eval_page(db_url, tmp_path / "eval", ARTIFACTS / f"eval-{backend}.png")  # `rollstream report`


def check_figures_match_the_events(db_url: str, train: list[Event]) -> None:
    rows = load_rows(db_url, TRAIN)
    drawn = {f.key: f for f in figures(rows, ReportSettings())}
    pass1 = drawn["pass1_by_version"].series[0]
    assert dict(zip(map(int, pass1.x), pass1.y, strict=True)) == pytest.approx(expected_pass1(train))
    finished = [e for e in train if e.type == "trajectory.finished"]
    assert drawn["outcomes"].points == drawn["long_tail"].points == len(finished)
    infra = sum(e.data.outcome.is_infra_error for e in finished)  # type: ignore[attr-defined]
    assert drawn["infra_errors"].points == infra > 0
    assert drawn["stability"].points == drawn["step_time"].points == 4
    assert drawn["heldout_pass1"].categories == ["base (v0)", "rl (v4)"]
    reason = drawn["step_time"].notes[1]  # what the trainer waited for, with the rollouts meanwhile
    assert (
        reason.startswith("the trainer waited")
        and "for groups not formed yet, with the CPU 95% busy" in reason
    )
    tail = tail_figures(fold_episodes(by_trajectory(train).values())).tail_share
    assert drawn["long_tail"].notes[0].startswith(f"{tail:.1%} of rollout wall time")  # as `rollstream tail`
    waits = [e.data.queue_wait_s for e in train if e.type == "sandbox.ready"]  # type: ignore[attr-defined]
    assert sorted(rows.cap_waits_s) == pytest.approx(sorted(waits))


def check_training_page(page: Path, shot: Path) -> None:
    """A run with every kind of data: every image decodes, no figure is empty."""
    seen = inspect_page(page, shot)
    print(f"screenshot: {shot}")
    assert seen.title == f"Rollstream run {TRAIN}"
    assert {f["key"] for f in seen.figures} == FIGURES
    assert len(seen.images) == len(FIGURES)
    for image in seen.images:
        assert image["decoded"] and image["width"] > 0 and image["height"] > 0, image
    for figure in seen.figures:
        assert figure["points"] > 0 and figure["empty"] == "false" and figure["images"] == 1, figure
        assert "no data" not in figure["caption"], figure
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def check_eval_page(db_url: str, out: Path, shot: Path) -> None:
    """An eval-only run: one version; the trainer and infra-error figures say "no data"."""
    code, output = report(EVAL, "--db", db_url, "--out", str(out))
    assert code == 0 and "no data for" in output, output
    seen = inspect_page(out / "index.html", shot)
    assert all(image["decoded"] and image["width"] > 0 for image in seen.images)
    empty = {f["key"] for f in seen.figures if f["empty"] == "true"}
    assert empty == EVAL_EMPTY
    assert all(f["caption"].startswith("no data: ") for f in seen.figures if f["key"] in empty)
    assert next(f for f in seen.figures if f["key"] == "pass1_by_version")["points"] == 1  # one version


def test_unknown_run_is_refused_with_the_runs_there(sqlite_url: str) -> None:
    from tests.store.batches import positioned, write_in_batches

    write_in_batches(sqlite_url, positioned(eval_run(EVAL)))
    code, out = report("no-such-run", "--db", sqlite_url)
    assert code == 2 and "no-such-run" in out and EVAL in out, out
