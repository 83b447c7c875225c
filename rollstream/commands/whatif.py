"""`rollstream whatif --run RUN --set policy.max_turns=40`: what other policies would have changed."""

from __future__ import annotations

import typer
from rich.table import Table

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from rollstream.recorded_runs import load_run, policies
from rollstream.tail_table import figure_rows
from streams.policies import cut_limits, explicit_policy_keys
from streams.whatif import what_if


def command(
    run: str = typer.Option(..., "--run", help="run id"),
    from_db: bool = typer.Option(False, "--from-db", help="read the SQL store's events table"),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Replay a run under other policies (--set policy.KEY=VALUE) and report what changes."""
    cfg = read_config(config, overrides)
    explicit = explicit_policy_keys(overrides or [])
    if not explicit:
        fail("give at least one --set policy.KEY=VALUE, e.g. --set policy.max_turns=40", code=2)
    recorded = load_run(cfg, run, from_db)
    old, new = policies(cfg, recorded, overrides or [])
    result = what_if(recorded, old, new, cut_limits(new, explicit))
    changes = ", ".join(f"{k}: {old.model_dump()[k]} -> {new.model_dump()[k]}" for k in sorted(explicit))
    summary = Table(title=f"what if {changes} (run {run})")
    summary.add_column("question")
    summary.add_column("answer", justify="right")
    summary.add_row("trajectories changed", f"{result.trajectories_changed} of {result.trajectories_total}")
    summary.add_row("groups changed", f"{result.groups_changed} of {result.groups_total}")
    summary.add_row(
        "groups kept (before -> after)", f"{result.groups_kept_before} -> {result.groups_kept_after}"
    )
    share = result.rollout_time_saved_s / result.rollout_time_s if result.rollout_time_s else 0.0
    summary.add_row("rollout time saved", f"{result.rollout_time_saved_s:.1f} s ({share:.1%})")
    summary.add_row("resolved trajectories lost", str(result.resolved_lost))
    console.print(summary)
    tail = Table(title="tail figures")
    for column in ("figure", "recorded", "what if"):
        tail.add_column(column, justify="right" if column != "figure" else "left")
    for (name, before), (_, after) in zip(figure_rows(result.before), figure_rows(result.after), strict=True):
        tail.add_row(name, before, after)
    console.print(tail)
