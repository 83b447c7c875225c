"""`rollstream up`: the pipeline's processes under the supervisor, shown live until Ctrl-C.

    rollstream up [--run RUN] [--engines N] [--stream-workers N] [--rollout-workers N]
                  [--sink/--no-sink] [--for SECONDS]

Starts (`plan_processes`) N engines (`engine serve` on ports engine.port, +1, ...;
following RUN's weights with --run), N stream workers, the SQL sink, N rollout workers
pointed at every engine (at `client.urls` with --engines 0) and, with --run, the trainer
(`train --run RUN`, under torchrun with `trainer.ranks` ranks when that is > 1). Every
child gets the same --config/--set. The supervisor
(`[supervisor]`) restarts what exits or hangs; the screen shows the run (`[live]`) and the
process table. SIGINT/SIGTERM, or --for elapsing, stops everything (TERM, wait, KILL) and
exits 0; a process given up after `supervisor.max_restarts` stops everything and exits 1.
Logs: `<state_dir>/runs/<RUN or up-TIME>/logs/<name>.log` and `supervisor.log`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass

import typer

from rollstream.command_line import ConfigPath, Overrides, config_args, console, fail, new_run_id, read_config
from rollstream.config import Config
from rollstream.launcher.process import port_in_use
from rollstream.live_render import show_live
from rollstream.live_view import RunFollower, RunView
from rollstream.supervisor import ProcessExitedError, Supervisor
from streams.topics import create_topics


@dataclass(frozen=True)
class Planned:
    name: str
    args: list[str]
    ranks: int = 1  # the trainer under torchrun: every rank beats (`rollstream.supervisor`)


def _names(kind: str, n: int) -> list[str]:
    return [kind] if n == 1 else [f"{kind}-{i}" for i in range(n)]


def engine_urls(cfg: Config, engines: int) -> list[str]:
    """The URLs of the engines `plan_processes` starts (ports from engine.port up), else client.urls."""
    if engines == 0:
        return list(cfg.client.urls)
    return [f"http://127.0.0.1:{cfg.engine.port + i}" for i in range(engines)]


def plan_processes(
    cfg: Config,
    *,
    run: str = "",
    engines: int = 1,
    stream_workers: int = 1,
    rollout_workers: int = 1,
    sink: bool = True,
) -> list[Planned]:
    """Names and `rollstream` arguments of the pipeline's processes (the trainer only with `run`)."""
    model, tasks = str(cfg.model_dir), str(cfg.tasks_dir)
    follow = ["--follow-weights", run] if run else []
    plan = [
        Planned(name, ["engine", "serve", "--model", model, "--port", str(cfg.engine.port + i), *follow])
        for i, name in enumerate(_names("engine", engines))
    ]
    plan += [Planned(name, ["worker", "--name", name]) for name in _names("worker", stream_workers)]
    if sink:
        plan.append(Planned("sink", ["sink"]))
    urls = [arg for url in engine_urls(cfg, engines) for arg in ("--engine", url)]
    plan += [
        Planned(name, ["rollout", "--tasks", tasks, "--model", model, *urls])
        for name in _names("rollout", rollout_workers)
    ]
    if run:  # `train` execs torchrun itself when trainer.ranks > 1
        plan.append(Planned("trainer", ["train", "--run", run], ranks=cfg.trainer.ranks))
    return plan


def command(
    run: str = typer.Option("", "--run", help="run id: start the trainer on it; engines follow its weights"),
    engines: int = typer.Option(1, "--engines", min=0, help="engines (0: use client.urls)"),
    stream_workers: int = typer.Option(1, "--stream-workers", min=0, help="stream workers"),
    rollout_workers: int = typer.Option(1, "--rollout-workers", min=0, help="rollout workers"),
    sink: bool = typer.Option(True, "--sink/--no-sink", help="run the SQL sink"),
    duration_s: float = typer.Option(0.0, "--for", min=0, help="stop after SECONDS (0: at Ctrl-C)"),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Start the pipeline's processes, restart what dies or hangs, show them live; Ctrl-C stops all."""
    cfg = read_config(config, overrides)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # retried errors would tear the live screen
    plan = plan_processes(
        cfg,
        run=run,
        engines=engines,
        stream_workers=stream_workers,
        rollout_workers=rollout_workers,
        sink=sink,
    )
    _check_inputs(cfg, engines, rollout_workers, needs_model=rollout_workers + engines > 0 or bool(run))
    try:
        asyncio.run(create_topics(cfg.kafka, cfg.topics))
    except Exception as error:
        fail(f"cannot create topics on {cfg.kafka.bootstrap} ({error}); is Kafka up (`rollstream kafka up`)?")
    log_dir = cfg.state_dir / "runs" / (run or new_run_id("up")) / "logs"
    supervisor = Supervisor(log_dir, config_args(config, overrides), cfg.supervisor)
    view = RunView(run or None, slots=cfg.rollout.concurrency * rollout_workers)
    since = None if run else time.time_ns()
    follower = RunFollower(cfg.kafka, cfg.topics, view, cfg.live, engine_urls(cfg, engines), since_ns=since)
    console.print(f"starting {', '.join(p.name for p in plan)}; logs in {log_dir}")
    try:
        with supervisor:
            for planned in plan:
                supervisor.start(planned.name, planned.args, ranks=planned.ranks)
            asyncio.run(_watch(follower, supervisor, duration_s, cfg.live.steps_shown))
    except ProcessExitedError as error:
        console.print(f"\n[bold red]stopped:[/] {error}")
        raise typer.Exit(1) from None
    console.print(f"\nstopped every process; logs in {log_dir}")


def _check_inputs(cfg: Config, engines: int, rollout_workers: int, *, needs_model: bool) -> None:
    """Fail before starting anything when a child could only crash (and be restarted in vain)."""
    for i in range(engines):
        if port_in_use(cfg.engine.port + i):
            fail(f"port {cfg.engine.port + i} is in use: set engine.port to a free base port")
    if needs_model and not (cfg.model_dir / "config.json").is_file():
        fail(f"{cfg.model_dir} is not a model directory: create one with `rollstream model init`")
    if rollout_workers and not cfg.tasks_dir.is_dir():
        fail(f"task directory {cfg.tasks_dir} does not exist: build one (`rollstream tasks`), set tasks.root")


async def _watch(follower: RunFollower, supervisor: Supervisor, duration_s: float, steps_shown: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if duration_s > 0:
        loop.call_later(duration_s, stop.set)
    await show_live(follower, console, stop, supervisor=supervisor, steps_shown=steps_shown)
