"""`rollstream eval --model DIR --tasks DIR --attempts K`: pass@1 through the real engine and sandboxes.

Starts an engine for the model (or uses `--engine URL`), runs K attempts of every task
as episodes under the eval's own run id (events in `rollout.events`, so the SQL sink
copies them), re-runs infrastructure errors (never counted as failures), and prints,
as its last line, `{"pass1": ..., "tasks": ..., "attempts": ..., "model_version": ...}`.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agents.evaluate import AttemptResult, EvalInfraError
from rollstream.command_line import (
    ConfigPath,
    Overrides,
    config_args,
    console,
    fail,
    new_run_id,
    read_config,
    resolve_model_dir,
)
from rollstream.evaluation import EngineStartError, evaluate_model
from rollstream.supervisor import ProcessExitedError
from sandboxes.tasks import TaskFormatError, load_tasks


def command(
    model: str = typer.Option(
        ..., "--model", help="model directory (a base model or a weight version) or a known model name"
    ),
    tasks: Path = typer.Option(..., "--tasks", help="task set directory (e.g. the family's heldout split)"),
    attempts: int | None = typer.Option(None, "--attempts", min=1, help="attempts per task (eval.attempts)"),
    run: str = typer.Option("", "--run", help="the eval's run id (default eval-<time>-<hex>)"),
    engine: str = typer.Option("", "--engine", help="use this engine instead of starting one"),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """pass@1 of a model on a task set; last line is one JSON object."""
    extra = [*(overrides or []), *([f"eval.attempts={attempts}"] if attempts else [])]
    cfg = read_config(config, extra)
    try:
        count = len(load_tasks(tasks))
    except TaskFormatError as error:
        fail(str(error), code=2)
    model_dir = resolve_model_dir(cfg, model, cfg.engine.dtype)
    run_id = run or new_run_id("eval")
    child_args = config_args(config, extra)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task(f"eval {run_id}", total=count * cfg.eval.attempts)
        solved = [0]

        def advance(result: AttemptResult) -> None:
            solved[0] += result.resolved
            progress.update(bar, advance=1, description=f"eval {run_id}: {solved[0]} resolved")

        try:
            result = evaluate_model(
                cfg,
                model_dir,
                tasks,
                run_id,
                log_dir=cfg.state_dir / "runs" / run_id / "logs",
                config_args=child_args,
                engine_url=engine,
                on_result=advance,
            )
        except (EvalInfraError, EngineStartError, ProcessExitedError) as error:
            fail(str(error))
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(result.outcomes.items()))
    console.print(f"pass@1 {result.pass1:.3f} over {result.tasks} tasks x {result.attempts} ({outcomes})")
    print(json.dumps(result.summary()))
