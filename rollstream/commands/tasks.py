"""`rollstream tasks ...`: build Harbor tasks from PyPI sdists, import SWE-bench, check, list.

- `tasks build --from-sdist NAME==VERSION --out DIR --max N [--seed S]`
- `tasks family --out DIR --split train|heldout --n N --seed S` (the learning task family)
- `tasks import-swebench FILE --out DIR`
- `tasks check DIR` (gold must score 1, no change 0; exit 1 when any task is invalid)
- `tasks default [--rebuild]` (the default set in `config.tasks_dir`)
- `tasks list [DIR]`
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from rollstream.default_tasks import RECIPE_FILE, DefaultTasksError, ensure_default_tasks
from sandboxes.backends import make_factory
from sandboxes.base import SandboxError
from sandboxes.tasks.build import BuildReport, BuildRequest, ProgressFn, build_from_sdist
from sandboxes.tasks.check import CheckResult, check_tasks
from sandboxes.tasks.family import FamilyError, write_family
from sandboxes.tasks.harbor import TaskFormatError, load_tasks
from sandboxes.tasks.sdist import SdistSpec, UnfitLibraryError
from sandboxes.tasks.swebench import SwebenchImportError, import_swebench

app = typer.Typer(
    help="Harbor tasks: build from PyPI sdists, import SWE-bench, check, list.", no_args_is_help=True
)


@contextmanager
def _progress() -> Iterator[ProgressFn]:
    """A rich progress display fed by the builder's (what, done, total) callbacks."""
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        rows: dict[str, object] = {}

        def update(what: str, done: int, total: int) -> None:
            library = what.split(":")[0]
            if library not in rows:
                rows[library] = progress.add_task(what, total=total)
            progress.update(rows[library], description=what, completed=done, total=total)  # type: ignore[arg-type]

        yield update


def _print_report(report: BuildReport) -> None:
    rejected = ", ".join(f"{reason} {count}" for reason, count in report.rejected.most_common()) or "none"
    console.print(
        f"[bold]{report.spec}[/]: {len(report.task_ids)} tasks in {report.duration_s:.1f}s "
        f"(baseline {report.baseline_passed} passed, {report.baseline_failed} failed; "
        f"{report.candidates} candidate mutants, {report.tried} tried; rejected: {rejected})"
    )


@app.command("build")
def build(
    from_sdist: Annotated[
        str, typer.Option("--from-sdist", help="NAME==VERSION of a PyPI source distribution")
    ],
    out: Annotated[Path, typer.Option(help="directory the tasks are written to")],
    max_tasks: Annotated[int, typer.Option("--max", min=1, help="at most this many tasks")] = 10,
    seed: Annotated[int, typer.Option(help="same seed, same tasks")] = 0,
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Inject bugs into a library by AST mutation and write one Harbor task per kept mutant."""
    cfg = read_config(config, overrides)
    try:
        spec = SdistSpec.parse(from_sdist)
    except ValueError as error:
        fail(str(error), code=2)
    request = BuildRequest(spec, out, max_tasks, seed)
    try:
        with _progress() as progress:
            report = asyncio.run(
                build_from_sdist(
                    request, cfg.tasks, make_factory(cfg.sandbox), cfg.state_dir / "cache", progress
                )
            )
    except UnfitLibraryError as error:
        fail(f"{error}")
    except SandboxError as error:
        fail(f"infra_error:{error.kind}: {error}", code=3)
    _print_report(report)
    if not report.task_ids:
        fail(f"{spec}: no mutant was kept; try another --seed or a larger tasks.max_mutants_tried")


@app.command("family")
def family(
    out: Annotated[Path, typer.Option(help="directory the tasks are written to")],
    split: Annotated[str, typer.Option(help="train (RL and SFT) or heldout (evaluation only)")] = "train",
    n: Annotated[int, typer.Option("--n", min=1, help="number of tasks")] = 64,
    seed: Annotated[int, typer.Option(help="same seed, same tasks")] = 0,
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """The learning task family: small libraries with one typed bug each, tests under a second."""
    cfg = read_config(config, overrides)
    try:
        tasks = write_family(out, split, n, seed, python=cfg.tasks.python)
    except FamilyError as error:
        fail(str(error), code=2)
    kinds = Counter(task.metadata.tags[-1] for task in tasks)
    shares = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
    console.print(f"wrote {len(tasks)} {split} tasks to {out} ({shares})")


@app.command("import-swebench")
def import_swebench_command(
    file: Annotated[Path, typer.Argument(help="SWE-bench / SWE-smith instances: a JSON list or JSON lines")],
    out: Annotated[Path, typer.Option(help="directory the tasks are written to")],
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Convert SWE-bench / SWE-smith instances to Harbor tasks that run in their Docker images."""
    cfg = read_config(config, overrides)
    try:
        ids = import_swebench(file, out, cfg.tasks)
    except SwebenchImportError as error:
        fail(str(error), code=2)
    console.print(f"wrote {len(ids)} tasks to {out}")


def _check_table(results: list[CheckResult]) -> Table:
    table = Table(title="tasks check")
    table.add_column("task", no_wrap=True)
    for column in ("gold", "no change", "valid", "seconds", "problem"):
        table.add_column(column)
    for result in results:
        table.add_row(
            result.task_id,
            "-" if result.gold_reward is None else f"{result.gold_reward:g}",
            "-" if result.none_reward is None else f"{result.none_reward:g}",
            "[green]yes[/]" if result.valid else "[red]no[/]",
            f"{result.duration_s:.1f}",
            _short(result.problem),
        )
    return table


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@app.command("check")
def check(
    directory: Annotated[Path, typer.Argument(help="a directory of Harbor tasks")],
    concurrency: Annotated[
        int | None, typer.Option(help="tasks at once; default tasks.check_concurrency")
    ] = None,
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Run every task's gold solution (must score 1) and no change (must score 0)."""
    cfg = read_config(config, overrides)
    try:
        tasks = load_tasks(directory)
    except TaskFormatError as error:
        fail(str(error), code=2)
    began = time.monotonic()
    with Progress(console=console) as progress:
        row = progress.add_task("checking tasks", total=len(tasks))
        results = asyncio.run(
            check_tasks(
                make_factory(cfg.sandbox),
                tasks,
                concurrency or cfg.tasks.check_concurrency,
                lambda _: progress.advance(row),
            )
        )
    console.print(_check_table(results))
    invalid = [r for r in results if not r.valid]
    console.print(f"{len(results) - len(invalid)}/{len(results)} valid in {time.monotonic() - began:.1f}s")
    if invalid:
        raise typer.Exit(1)


@app.command("default")
def default(
    rebuild: Annotated[bool, typer.Option(help="build again even when the recipe is unchanged")] = False,
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Build the default task set into tasks_dir (only when its recipe changed)."""
    cfg = read_config(config, overrides)
    began = time.monotonic()
    try:
        with _progress() as progress:
            directory = ensure_default_tasks(cfg, rebuild=rebuild, progress=progress)
    except (DefaultTasksError, UnfitLibraryError) as error:
        fail(str(error))
    except SandboxError as error:
        fail(f"infra_error:{error.kind}: {error}", code=3)
    count = len(load_tasks(directory))
    recipe = json.loads((directory / RECIPE_FILE).read_text()) if (directory / RECIPE_FILE).is_file() else {}
    for library, ids in recipe.get("libraries", {}).items():
        console.print(f"  {library}: {len(ids)} tasks")
    built = f"; built in {recipe['build_s']}s" if "build_s" in recipe else ""
    console.print(f"{count} default tasks in {directory} ({time.monotonic() - began:.1f}s{built})")


@app.command("list")
def list_tasks(
    directory: Annotated[Path | None, typer.Argument(help="task directory; default tasks_dir")] = None,
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """One line per task: id, source, fail-to-pass and pass-to-pass counts."""
    root = directory or read_config(config, overrides).tasks_dir
    try:
        tasks = load_tasks(root)
    except TaskFormatError as error:
        fail(str(error), code=2)
    table = Table(title=f"{len(tasks)} tasks in {root}")
    table.add_column("task", no_wrap=True)
    for column in ("source", "fail→pass", "pass→pass", "mutation"):
        table.add_column(column)
    for task in tasks:
        meta = task.metadata
        table.add_row(
            task.id, meta.source, str(len(meta.fail_to_pass)), str(len(meta.pass_to_pass)), meta.mutation
        )
    console.print(table)
