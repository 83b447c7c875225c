"""`write_run_report(url, run, out)`: query the SQL store, compute the figures, draw them, write the page.

The store is opened read-only (`streams.store.open_readonly`), every query runs on
one connection, and the output directory gets one PNG per figure plus `index.html`.
A run id the store has never seen is an error (`ReportError`, naming the runs it
has) rather than a page of "no data" panels, and so is a store at an older schema
revision (`rollstream db upgrade` brings it up, correcting what later revisions fix).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

from rollstream.report.figures import Figure, figures
from rollstream.report.page import page_html
from rollstream.report.plots import plot
from rollstream.report.queries import RunRows, run_ids, run_rows
from rollstream.report.settings import ReportSettings
from rollstream.report.tables import OUTCOME_COLUMNS, outcome_cells, summary
from streams.store import open_readonly
from streams.store.migrate import current_revision, head_revision

RUNS_NAMED = 10  # runs listed in the "no such run" message


class ReportError(RuntimeError):
    """The report cannot be written; the message says why and what to do."""


@dataclass(frozen=True)
class Report:
    page: Path
    figures: list[Figure]


def load_rows(url: str, run_id: str) -> RunRows:
    """Everything the report shows about `run_id`, read from the store at `url` (at the newest
    schema revision: an older one may hold projections the migrations since have corrected)."""
    engine = open_readonly(url)
    try:
        at, head = current_revision(engine), head_revision()
        if at != head:
            raise ReportError(
                f"the store at {_safe(url)} is at schema revision {at}, not {head}: run "
                f"`rollstream db upgrade --db URL` first (0004 attributes trajectories to their first "
                "token's weight version)"
            )
        with engine.connect() as conn:
            rows = run_rows(conn, run_id)
            if not rows.outcomes and not rows.steps and not rows.versions:
                known = run_ids(conn)[:RUNS_NAMED]
                raise ReportError(
                    f"run {run_id!r} has no trajectories or trainer steps in {_safe(url)}; "
                    f"runs there: {', '.join(known) or 'none'}"
                )
            return rows
    finally:
        engine.dispose()


def write_report_files(rows: RunRows, out: Path, source: str, settings: ReportSettings) -> Report:
    """PNGs and `index.html` for `rows` in `out` (pure of the database)."""
    out.mkdir(parents=True, exist_ok=True)
    drawn = figures(rows, settings)
    for figure in drawn:
        plot(figure, out / f"{figure.key}.png", settings)
    page = out / "index.html"
    outcomes = (OUTCOME_COLUMNS, [outcome_cells(row) for row in rows.rewards])
    html = page_html(
        rows.run_id, source, summary(rows, settings), [(f, f"{f.key}.png") for f in drawn], outcomes
    )
    page.write_text(html)
    return Report(page, drawn)


def write_run_report(url: str, run_id: str, out: Path, settings: ReportSettings | None = None) -> Report:
    """The run report of `run_id` from the store at `url`, written into `out`."""
    rows = load_rows(url, run_id)
    return write_report_files(rows, out, _safe(url), settings or ReportSettings())


def _safe(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)
