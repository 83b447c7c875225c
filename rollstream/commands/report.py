"""`rollstream report RUN [--out DIR]`: the run report (index.html + PNGs) from the SQL store.

Every figure is queried from the event store (`--db`, default the config's
`db_url`: SQLite or PostgreSQL), opened read-only. The default output directory is
`<state_dir>/runs/<run>/report`, where the demo writes its own at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from rollstream.report.build import ReportError, write_run_report
from streams.store import StoreError


def command(
    run: Annotated[
        str, typer.Argument(help="run id (see: rollstream sql 'SELECT DISTINCT run_id FROM trajectories')")
    ],
    out: Annotated[
        Path | None, typer.Option("--out", help="output directory (default: <state_dir>/runs/<run>/report)")
    ] = None,
    db: Annotated[
        str | None, typer.Option("--db", help="database URL (default: the config's db_url)")
    ] = None,
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Write a run's report (index.html with PNG figures), every figure queried from the SQL store."""
    cfg = read_config(config, overrides)
    target = out or cfg.state_dir / "runs" / run / "report"
    try:
        report = write_run_report(db or cfg.db_url, run, target, cfg.report)
    except (ReportError, StoreError) as error:
        fail(str(error), code=2)
    empty = [f.key for f in report.figures if f.points == 0]
    console.print(f"report: [bold]{report.page}[/] ({len(report.figures)} figures)")
    if empty:
        console.print(f"no data for: {', '.join(empty)}")
