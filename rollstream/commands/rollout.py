"""`rollstream rollout`: run a rollout worker; `rollstream rollout submit`: write a run's requests.

    rollstream rollout [--tasks DIR] [--engine URL ...] [--concurrency C] [--model DIR] [--policy expert]
    rollstream rollout submit --tasks DIR --group-size 8 [--run RUN] [--groups N]

The worker uses the configured sandbox backend and pool caps, the engine client
(`--engine` replaces `client.urls`), the policy model's tokenizer (`--model`,
default `config.model_dir`), and the task set (`--tasks`, default
`config.tasks_dir`; requests name tasks by directory). It runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import typer
from rich.live import Live
from rich.table import Table

from agents.chat import ChatFormat
from agents.engine.faults import make_client
from agents.expert import ExpertPolicy
from agents.mini_swe.runtime import MiniUnavailable
from agents.policy import Policy
from agents.rollout import RolloutWorker
from agents.submit import limits_of, run_requests, submit_requests, task_refs
from agents.worker_setup import TaskCatalog, WorkerSettings
from rollstream.agent_gateway import worker_gateway
from rollstream.command_line import ConfigPath, Overrides, console, fail, new_run_id, read_config
from rollstream.config import Config
from rollstream.rollout_services import episode_services
from sandboxes.backends import make_factory
from sandboxes.pool import SandboxPool
from streams.heartbeat import start_heartbeat

app = typer.Typer(help="Rollout workers and their requests.", invoke_without_command=True)

TasksOption = typer.Option(None, "--tasks", help="task set directory (default: the config's tasks dir)")


@app.callback(invoke_without_command=True)
def rollout(
    ctx: typer.Context,
    tasks: Path | None = TasksOption,
    engine: list[str] | None = typer.Option(None, "--engine", help="engine URL (repeat for several)"),
    concurrency: int | None = typer.Option(None, "--concurrency", min=1, help="episodes at once"),
    model: Path | None = typer.Option(None, "--model", help="model directory (for its tokenizer)"),
    policy: str = typer.Option(
        "engine", "--policy", help="engine: the model behind --engine; expert: the family's scripted expert"
    ),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Run a rollout worker: consume rollout.requests, run episodes, write rollout.events."""
    if ctx.invoked_subcommand is not None:
        return
    if policy not in ("engine", "expert"):
        fail(f"--policy {policy!r}: use engine or expert")
    cfg = read_config(config, overrides)
    if engine:
        cfg = cfg.model_copy(update={"client": cfg.client.model_copy(update={"urls": tuple(engine)})})
    if concurrency is not None:
        cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"concurrency": concurrency})})
    tasks_root = tasks or cfg.tasks_dir
    model_dir = model or cfg.model_dir
    if not tasks_root.is_dir():
        fail(f"task directory {tasks_root} does not exist; pass --tasks or build one with `rollstream tasks`")
    try:
        chat = ChatFormat.from_model_dir(model_dir)
    except (FileNotFoundError, ValueError) as error:
        fail(str(error))
    console.print(
        f"rollout worker on {cfg.kafka.bootstrap} (prefix {cfg.topics.prefix!r}): "
        f"{'the scripted expert' if policy == 'expert' else 'engines ' + ', '.join(cfg.client.urls)}, "
        f"agent {cfg.agent.scaffold}, {cfg.sandbox.backend} sandboxes, concurrency {cfg.rollout.concurrency}"
    )
    try:
        asyncio.run(_serve(cfg, chat, tasks_root, model_dir, expert=policy == "expert"))
    except (MiniUnavailable, ValueError) as error:
        fail(str(error))


async def _serve(
    cfg: Config, chat: ChatFormat, tasks_root: Path, model_dir: Path, *, expert: bool = False
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    start_heartbeat()  # beats from the worker's loop (supervisor)
    pool = SandboxPool(cfg.sandbox, make_factory(cfg.sandbox))
    async with (
        make_client(cfg.client) as client,
        pool,
        worker_gateway(cfg, chat, client, model_dir, expert=expert) as gateway,
    ):
        policy: Policy = ExpertPolicy(chat, cfg.expert, cfg.agent) if expert else client
        worker = RolloutWorker(
            WorkerSettings(cfg.kafka, cfg.topics, cfg.rollout, cfg.policy),
            episode_services(cfg, policy, pool, chat, gateway),
            TaskCatalog(tasks_root),
        )
        task = asyncio.create_task(worker.run(stop))
        with Live(_table(worker), console=console, refresh_per_second=1, transient=True) as live:
            while not task.done():
                await asyncio.wait({task}, timeout=1.0)
                live.update(_table(worker))
        await task
        console.print(_table(worker))


def _table(worker: RolloutWorker) -> Table:
    table = Table(title=f"rollout worker {worker.name}")
    for column in ("in flight", "finished", "finished before", "events", "infra retries", "outcomes"):
        table.add_column(column)
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(worker.outcomes.items())) or "-"
    finished = sum(worker.outcomes.values())
    counts = (worker.in_flight, finished, worker.skipped_finished, worker.events_written, worker.retries_sent)
    table.add_row(*(str(n) for n in counts), outcomes)
    return table


@app.command()
def submit(
    tasks: Path | None = TasksOption,
    group_size: int | None = typer.Option(None, "--group-size", min=1, help="attempts per task (policy)"),
    run: str = typer.Option("", "--run", help="run id (default: run.name, else a new one)"),
    groups: int = typer.Option(1, "--groups", min=1, help="groups per task"),
    first_group: int = typer.Option(0, "--first-group", min=0, help="index of the first group"),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Write `group-size` rollout requests per task (and group) to rollout.requests."""
    cfg = read_config(config, overrides)
    tasks_root = tasks or cfg.tasks_dir
    try:
        refs = task_refs(tasks_root)
    except FileNotFoundError as error:
        fail(str(error))
    run_id = run or cfg.run.name or new_run_id("run")
    size = group_size or cfg.policy.group_size
    events = run_requests(
        run_id, refs, size, limits_of(cfg.policy), groups_per_task=groups, first_group=first_group
    )
    written = asyncio.run(submit_requests(cfg.kafka, cfg.topics, events))
    console.print(f"run [bold]{run_id}[/]: {written} requests ({len(refs)} tasks x {groups} groups x {size})")
    print(run_id)


if __name__ == "__main__":  # `python -m rollstream.commands.rollout`: the worker without the whole CLI
    app()
