"""`rollstream bench learning [--seed S]`: base, SFT and RL from scratch, each evaluated on held-out tasks.

The whole of `rollstream.learning` for one seed, in a fresh `<state_dir>/learning/seed-S/`:
the family's train and held-out splits and a base model from the seed; pass@1 of the
base model; the scripted expert's rollouts through a rollout and a stream worker; SFT
data replayed from the log; SFT; pass@1 of the SFT model; RL from the SFT model with
the trainer in the loop (engine following `weights`, stream worker, rollout worker,
trainer) for `learning.rl_steps` steps; pass@1 of the last RL version. All evaluations
run `eval.attempts` attempts of every held-out task (`rollstream eval`'s code).

Last line: `{"base_pass1", "sft_pass1", "rl_pass1", "rl_steps", "wall_s", "ratio",
"model", ...}` with ratio = rl_pass1 / sft_pass1 (the reference run: 2.1), each pass@1's
standard error over tasks (`*_pass1_stderr`) and the gains SFT - base and RL - SFT with their
standard errors paired by task (`sft_gain`, `rl_gain`, `*_gain_stderr`).
Targets (2 CPU cores, within 30 minutes): RL at least 15 points of pass@1 over SFT,
SFT at least 10 over base, for any seed.

`--model NAME|DIR` starts from a pretrained model instead (`learning.base_model`, with
`rollstream.learning.PRETRAINED_DEFAULTS`): base is the pretrained model as it is, and the run
lives in `<state_dir>/learning/<model>/seed-S/`. Targets for SmolLM2-135M-Instruct on 2 cores:
SFT >= base + 15 points, RL >= SFT + 8 points and >= 2 standard errors, within 90 minutes.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import typer

from agents.evaluate import EvalResult, paired_gain
from bench.local_broker import ensure_local_broker
from rollstream.command_line import ConfigPath, Overrides, config_args, console, fail, new_run_id, read_config
from rollstream.config import Config
from rollstream.evaluation import evaluate_model
from rollstream.learning import (
    LearningError,
    LearningPaths,
    build_sft_model,
    collect_expert,
    latest_version_dir,
    learning_overrides,
    learning_paths,
    prepare,
    start_rl_processes,
)
from rollstream.rl_feed import feed_until_trained
from rollstream.run_progress import wait_for_sink
from rollstream.run_summary import summarise_run
from rollstream.supervisor import ProcessExitedError, Supervisor


def command(
    seed: int = typer.Option(0, "--seed", help="tasks, model init and the expert's choices"),
    steps: int | None = typer.Option(None, "--steps", min=1, help="RL steps (learning.rl_steps)"),
    model: str | None = typer.Option(
        None, "--model", help="start from a pretrained model (directory or known name) instead of a small one"
    ),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Base -> SFT -> RL on the learning family; pass@1 of each on held-out tasks; last line JSON."""
    extra = [
        *learning_overrides(model),
        f"learning.seed={seed}",
        *([f"learning.rl_steps={steps}"] if steps else []),
        *isolated(f"bl{seed}-{uuid.uuid4().hex[:6]}"),
        *(overrides or []),
    ]
    cfg = read_config(config, extra)
    ensure_local_broker(cfg)
    child_args = config_args(config, extra)
    began = time.monotonic()
    shutil.rmtree(learning_paths(cfg).root, ignore_errors=True)  # from scratch
    try:
        figures = _run(cfg, prepare(cfg), child_args, new_run_id(f"bench-learning-s{seed}"))
    except (LearningError, ProcessExitedError, TimeoutError) as error:
        fail(str(error))
    figures["model"] = model or "small (model init)"
    figures["wall_s"] = round(time.monotonic() - began, 1)
    figures["ratio"] = round(figures["rl_pass1"] / figures["sft_pass1"], 3) if figures["sft_pass1"] else None
    print(json.dumps(figures))


def isolated(name: str) -> list[str]:
    """Fresh topics and consumer groups: no request or rebalance of another run reaches this one."""
    return [
        f'topics.prefix="{name}-"',
        f'rollout.consumer_group="{name}-rollout"',
        f'streams.group_id="{name}-streams"',
        f'trainer.consumer_group="{name}-trainer"',
    ]


def _run(cfg: Config, paths: LearningPaths, config_args: list[str], run: str) -> dict:
    logs = cfg.state_dir / "runs" / run / "logs"
    timings: dict[str, float] = {}

    def evaluate(model: Path, name: str) -> EvalResult:
        t0 = time.monotonic()
        result = evaluate_model(
            cfg, model, paths.heldout_tasks, f"{run}-eval-{name}", log_dir=logs, config_args=config_args
        )
        timings[f"eval_{name}_s"] = round(time.monotonic() - t0, 1)
        console.print(
            f"{name}: pass@1 {result.pass1:.3f} ({result.outcomes}) in {timings[f'eval_{name}_s']} s"
        )
        return result

    with Supervisor(logs, config_args, cfg.supervisor) as services:
        services.start("sink", ["sink"])  # every run's events into SQL, for the report at the end
        figures = _phases(cfg, paths, config_args, run, evaluate, timings)
        for name in (run, f"{run}-eval-base", f"{run}-eval-sft", f"{run}-eval-rl"):
            asyncio.run(wait_for_sink(cfg, name, services, timeout_s=300.0))
    report = summarise_run(cfg, run, cfg.state_dir / "runs" / run / "report")
    console.print(f"report: {report}")
    return figures


def _phases(
    cfg: Config,
    paths: LearningPaths,
    config_args: list[str],
    run: str,
    evaluate: Callable[[Path, str], EvalResult],
    timings: dict[str, float],
) -> dict:
    """Base eval, expert rollouts and SFT, SFT eval, RL (run id `run`), RL eval: the JSON figures."""
    logs = cfg.state_dir / "runs" / run / "logs"
    base = evaluate(paths.base_model, "base")
    t0 = time.monotonic()
    with Supervisor(logs, config_args, cfg.supervisor) as pipeline:
        collect_expert(cfg, paths, f"{run}-expert", pipeline)
    sft_model = build_sft_model(cfg, paths, f"{run}-expert", config_args)
    timings["expert_and_sft_s"] = round(time.monotonic() - t0, 1)
    sft = evaluate(sft_model, "sft")
    t0 = time.monotonic()
    rl_run = run  # the report of `run` shows it with its evaluations `run-eval-*`
    with Supervisor(logs, config_args, cfg.supervisor) as pipeline:
        start_rl_processes(cfg, paths, rl_run, sft_model, cfg.learning.rl_steps, pipeline, with_sink=False)
        progress = asyncio_run_feed(cfg, paths, rl_run, pipeline)
    timings["rl_s"] = round(time.monotonic() - t0, 1)
    if progress.train_solved:
        console.print(
            f"RL ended at step {progress.step}: every train task was solved by a whole group "
            "(learning.end_when_train_solved)"
        )
    rl = evaluate(latest_version_dir(cfg.weights_dir / rl_run), "rl")
    sft_gain, sft_gain_se = paired_gain(base, sft)
    rl_gain, rl_gain_se = paired_gain(sft, rl)
    return {
        "base_pass1": round(base.pass1, 4),
        "sft_pass1": round(sft.pass1, 4),
        "rl_pass1": round(rl.pass1, 4),
        "base_pass1_stderr": round(base.pass1_stderr, 4),
        "sft_pass1_stderr": round(sft.pass1_stderr, 4),
        "rl_pass1_stderr": round(rl.pass1_stderr, 4),
        "sft_gain": round(sft_gain, 4),
        "sft_gain_stderr": round(sft_gain_se, 4),
        "rl_gain": round(rl_gain, 4),
        "rl_gain_stderr": round(rl_gain_se, 4),
        "rl_steps": progress.step,
        "seed": cfg.learning.seed,
        "heldout_tasks": sft.tasks,
        "attempts": sft.attempts,
        "rl_groups": progress.groups_formed,
        "rl_tasks_solved": progress.tasks_solved,
        "rl_ended_train_solved": progress.train_solved,
        **timings,
    }


def asyncio_run_feed(cfg: Config, paths: LearningPaths, run_id: str, pipeline: Supervisor):  # type: ignore[no-untyped-def]
    last = [-1]

    def show(progress) -> None:  # type: ignore[no-untyped-def]
        if progress.step != last[0]:
            last[0] = progress.step
            console.print(
                f"RL step {progress.step}: {progress.groups_formed} groups formed, "
                f"{progress.groups_submitted} submitted, "
                f"{progress.tasks_solved} tasks solved"
            )

    return asyncio.run(feed_until_trained(cfg, paths, run_id, pipeline, show))
