"""`rollstream demo` (`make run`): the main job, a policy that learns, on this machine.

    Kafka, topics; the learning family's train and held-out tasks; a base model      prepare
    the SFT model: expert rollouts through the log, replayed, SFT (first run only)    ensure_sft_model
    pass@1 on held-out tasks before RL                                               evaluate_model
    supervised processes: SQL sink, monitor, engine following `weights`,
        stream worker, rollout worker, trainer (`--steps N`); a live view           start_rl_processes
    pass@1 on held-out tasks after RL (the last weight version)                      evaluate_model
    the run report from SQL (PNGs + HTML)                                            summarise_run

Every process is started and restarted by `rollstream.supervisor.Supervisor`; Ctrl-C
(SIGINT) or SIGTERM stops them all, and nothing the demo started outlives it. The
family's caps (`rollstream.learning.LEARNING_DEFAULTS`) come before the user's `--set`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import typer

from agents.evaluate import EvalResult
from rollstream.command_line import ConfigPath, Overrides, config_args, console, fail, new_run_id, read_config
from rollstream.config import Config
from rollstream.evaluation import evaluate_model
from rollstream.launcher.kafka import ensure_up, points_at_local_broker
from rollstream.learning import (
    LearningError,
    LearningPaths,
    ensure_sft_model,
    latest_version_dir,
    learning_overrides,
    prepare,
    start_rl_processes,
)
from rollstream.live_render import show_live
from rollstream.live_view import RunFollower, RunView
from rollstream.rl_feed import feed_until_trained
from rollstream.run_progress import wait_for_sink
from rollstream.run_summary import summarise_run
from rollstream.supervisor import ProcessExitedError, Supervisor

DEFAULT_STEPS = 16  # ~6 min of RL on 2 cores: make run took 12 min on a fresh clone (README)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the demo: stop everything and exit 130. A KeyboardInterrupt, so no
    `except Exception` swallows it and asyncio re-raises it out of the loop from any task."""


def command(
    steps: int = typer.Option(DEFAULT_STEPS, "--steps", min=1, help="trainer steps of RL"),
    timeout_s: float = typer.Option(1800.0, "--timeout", help="give up RL after this many seconds"),
    model: str | None = typer.Option(
        None, "--model", help="a pretrained model (directory or known name) instead of the small one"
    ),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Train the policy with RL through the whole pipeline; pass@1 before and after; a report."""
    extra = [*learning_overrides(model), *(overrides or [])]
    cfg = read_config(config, extra)
    run_id = cfg.run.name or new_run_id("demo")
    console.rule(f"[bold]Rollstream demo · run {run_id}")
    child_args = config_args(config, extra)
    run_dir = cfg.state_dir / "runs" / run_id
    try:
        with _signals_raise():
            before, after = _run(cfg, run_id, steps, timeout_s, child_args, run_dir)
    except Interrupted:
        console.print("[yellow]interrupted: every process stopped[/]")
        raise typer.Exit(130) from None
    except (LearningError, ProcessExitedError, TimeoutError) as error:
        fail(f"{error}\nlogs: {run_dir / 'logs'}")
    console.print(
        f"[bold]held-out pass@1: {before.pass1:.3f} before RL (version {before.model_version}) -> "
        f"{after.pass1:.3f} after {steps} steps (version {after.model_version})[/]"
    )
    summary = {
        "run_id": run_id,
        "pass1_before": before.pass1,
        "pass1_after": after.pass1,
        "version_before": before.model_version,
        "version_after": after.model_version,
    }
    print(json.dumps(summary))


def _run(
    cfg: Config, run_id: str, steps: int, timeout_s: float, config_args: list[str], run_dir: Path
) -> tuple[EvalResult, EvalResult]:
    logs = run_dir / "logs"
    paths = _prepare(cfg)
    with Supervisor(logs, config_args, cfg.supervisor) as services:
        services.start("sink", ["sink"])
        services.start("monitor", ["monitor", "--port", str(cfg.monitor.port)])
        console.print(f"monitor: http://127.0.0.1:{cfg.monitor.port}/metrics (Prometheus text format)")
        sft_model = ensure_sft_model(cfg, paths, logs, config_args)
        console.print(f"SFT model: {sft_model}")
        before = _evaluate(cfg, paths, sft_model, f"{run_id}-eval-before", logs, config_args)
        with Supervisor(logs, config_args, cfg.supervisor) as pipeline:
            url = start_rl_processes(cfg, paths, run_id, sft_model, steps, pipeline, with_sink=False)
            asyncio.run(_train_live(cfg, paths, run_id, pipeline, url, timeout_s))
        after = _evaluate(
            cfg,
            paths,
            latest_version_dir(cfg.weights_dir / run_id),
            f"{run_id}-eval-after",
            logs,
            config_args,
        )
        for run in (run_id, before.run_id, after.run_id):  # the report and SQL see every event
            asyncio.run(wait_for_sink(cfg, run, services, timeout_s=120.0))
        summarise_run(cfg, run_id, run_dir / "report")
    return before, after


def _prepare(cfg: Config) -> LearningPaths:
    if points_at_local_broker(cfg):  # a remote cluster in kafka.bootstrap is used as it is
        with console.status("starting Kafka (the first time fetches its jars from Maven Central)"):
            ensure_up(cfg)
    with console.status("preparing the learning family's tasks and the base model"):
        paths = prepare(cfg)
    console.print(f"tasks: {paths.train_tasks} (train), {paths.heldout_tasks} (held-out)")
    return paths


def _evaluate(
    cfg: Config, paths: LearningPaths, model: Path, run: str, logs: Path, config_args: list[str]
) -> EvalResult:
    with console.status(f"held-out pass@1 of {model} ({cfg.eval.attempts} attempts per task)"):
        result = evaluate_model(cfg, model, paths.heldout_tasks, run, log_dir=logs, config_args=config_args)
    console.print(f"held-out pass@1 of version {result.model_version}: {result.pass1:.3f} ({run})")
    return result


async def _train_live(
    cfg: Config, paths: LearningPaths, run_id: str, pipeline: Supervisor, url: str, timeout_s: float
) -> None:
    """Feed the trainer groups while the live view shows the run, until the trainer has its steps."""
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(timeout_s, stop.set)
    view = RunView(run_id, slots=cfg.rollout.concurrency)
    follower = RunFollower(cfg.kafka, cfg.topics, view, cfg.live, [url], since_ns=time.time_ns() - 60 * 10**9)
    feeding = asyncio.create_task(feed_until_trained(cfg, paths, run_id, pipeline))
    try:
        await show_live(follower, console, stop, supervisor=pipeline, until=lambda _: feeding.done())
    finally:
        if not feeding.done():
            feeding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeding  # raises what the feeder raised
    if not feeding.cancelled() and feeding.result().train_solved:
        console.print(
            f"RL ended at step {feeding.result().step}: every train task was solved by a whole "
            "group (learning.end_when_train_solved)"
        )
    elif not pipeline.done("trainer"):
        raise TimeoutError(f"the trainer did not finish its steps within {timeout_s:.0f} s")


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` in the main thread, so every `with` unwinds and stops."""

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
