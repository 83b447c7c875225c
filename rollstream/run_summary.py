"""The end of a run: tail figures, outcomes, groups and sandbox timings as tables, a summary
answered by the SQL store, and the run report (PNGs + HTML, every figure queried from the store)."""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from rich.table import Table

from rollstream.command_line import console
from rollstream.config import Config
from rollstream.report.build import write_run_report
from rollstream.report.queries import outcome_rewards
from rollstream.report.tables import OUTCOME_CAPTION, OUTCOME_COLUMNS, outcome_cells
from rollstream.tail_table import figure_rows, figures_table
from streams.events import Event
from streams.replay import RecordedRun, by_trajectory, fold_episodes, load_from_topics
from streams.store import open_readonly
from streams.tail import tail_figures


def summarise_run(cfg: Config, run_id: str, out: Path) -> Path:
    """Print the run's tables and write its report into `out`; returns the HTML path."""
    recorded = asyncio.run(load_from_topics(cfg.kafka, cfg.topics, run_id))
    figures = tail_figures(fold_episodes(by_trajectory(recorded.events).values()))
    tables: dict[str, Mapping[str, object]] = {
        "Tail figures": dict(figure_rows(figures)),
        "Outcomes": outcome_counts(recorded.events),
        "Groups": group_counts(recorded),
        "Sandboxes": sandbox_figures(recorded.events),
    }
    for title, rows in tables.items():
        console.print(figures_table(title, rows.items()))
    console.print(sql_summary(cfg.db_url, run_id))
    report = write_run_report(cfg.db_url, run_id, out, cfg.report)
    page = report.page
    console.print(f"report: [bold]{page}[/] ({len(report.figures)} figures from the SQL store)")
    console.print(f"ask more in SQL: rollstream sql \"SELECT * FROM trajectories WHERE run_id = '{run_id}'\"")
    return page


def outcome_counts(events: list[Event]) -> dict[str, int]:
    finished = [e for e in events if e.type == "trajectory.finished"]
    return dict(sorted(Counter(str(e.data.outcome) for e in finished).items()))  # type: ignore[attr-defined]


def group_counts(recorded: RecordedRun) -> dict[str, int]:
    reasons = Counter((g.data.dropped or "kept") for g in recorded.groups)  # type: ignore[attr-defined]
    return {f"groups {reason}": n for reason, n in sorted(reasons.items())}


def sandbox_figures(events: list[Event]) -> dict[str, str]:
    ready = [e.data for e in events if e.type == "sandbox.ready"]
    failed = sum(1 for e in events if e.type == "sandbox.failed")
    if not ready:
        return {"sandboxes started": "0", "sandbox failures": str(failed)}
    starts = [d.start_s for d in ready]  # type: ignore[attr-defined]
    waits = [d.queue_wait_s for d in ready]  # type: ignore[attr-defined]
    return {
        "sandboxes started": str(len(ready)),
        "sandbox failures": str(failed),
        "start median": f"{statistics.median(starts):.3f} s",
        "start max": f"{max(starts):.3f} s",
        "queue wait median (caps)": f"{statistics.median(waits):.3f} s",
        "queue wait max (caps)": f"{max(waits):.3f} s",
    }


def sql_summary(url: str, run_id: str) -> Table:
    """The outcomes table from the store: the verifier's mean reward beside the trainer's (they differ
    where a policy changed it, e.g. `policy.overlong="zero"` trains a truncated episode as 0)."""
    table = Table(title=f"from the SQL store ({url})", caption=OUTCOME_CAPTION)
    engine = open_readonly(url)
    try:
        with engine.connect() as connection:
            rows = outcome_rewards(connection, run_id)
    finally:
        engine.dispose()
    widest = max((len(row.outcome) for row in rows), default=7)
    table.add_column(OUTCOME_COLUMNS[0], no_wrap=True, min_width=widest)  # outcomes whole, numbers squeeze
    for column in OUTCOME_COLUMNS[1:]:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*outcome_cells(row))
    return table
