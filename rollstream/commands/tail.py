"""`rollstream tail --run RUN`: the reference run's tail figures for any run."""

from __future__ import annotations

import typer

from rollstream.command_line import ConfigPath, Overrides, console, read_config
from rollstream.recorded_runs import load_run
from rollstream.tail_table import figure_rows, figures_table
from streams.replay import by_trajectory, fold_episodes
from streams.tail import tail_figures


def command(
    run: str = typer.Option(..., "--run", help="run id"),
    from_db: bool = typer.Option(False, "--from-db", help="read the SQL store's events table"),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Tail figures of a run: turn cap share, median resolved turns, wall time after 90%, slowest."""
    cfg = read_config(config, overrides)
    recorded = load_run(cfg, run, from_db)
    figures = tail_figures(fold_episodes(by_trajectory(recorded.events).values()))
    console.print(figures_table(f"tail of run {run}", figure_rows(figures)))
