"""`rollstream demo`: the main job — one whole pipeline run on this machine, with a report.

    start Kafka, create topics, build the default task set, initialise a small policy model
    start processes: engine (SGLang contract) · stream worker · SQL sink · rollout worker
    submit N tasks x G attempts, follow the groups as they form (progress bar)
    report: tail figures, outcomes, groups, sandbox caps; PNGs + HTML; a SQL summary

The demo's small caps (turns, tokens per turn, tokens per trajectory, context) are
applied before the user's `--set` overrides, so any of them can be changed. The
policy model is randomly initialised: it does not solve tasks, so expect
`unresolved` trajectories and zero-variance groups; the point is the pipeline, the
events and the report. Point `--engine` at a real model's SGLang server to do better.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid

import typer

from agents.submit import limits_of, run_requests, submit_requests, task_refs
from rollstream.commands.common import ConfigPath, Overrides, console, fail, read_config
from rollstream.config import Config
from rollstream.default_tasks import ensure_default_tasks
from rollstream.launcher.kafka import ensure_up, points_at_local_broker
from rollstream.launcher.process import port_in_use
from rollstream.pipeline import Pipeline, ProcessExitedError
from rollstream.run_progress import wait_for_groups, wait_for_sink
from rollstream.run_summary import summarise_run
from streams.topics import create_topics
from trainer.checkpoint import init_model_dir

DEMO_DEFAULTS = [
    "policy.max_turns=6",
    "policy.max_new_tokens_per_turn=48",
    "policy.max_trajectory_tokens=384",
    "policy.context_cap=4096",
    "policy.group_deadline_s=120",
    "engine.context_length=4096",
    "rollout.concurrency=16",
    "sandbox.pool.warm_pool=4",
]


def command(
    tasks: int = typer.Option(4, "--tasks", min=1, help="tasks to run (from the default set)"),
    group_size: int = typer.Option(4, "--group-size", min=2, help="attempts per task"),
    timeout_s: float = typer.Option(600.0, "--timeout", help="give up after this many seconds"),
    engine: str = typer.Option("", "--engine", help="use this SGLang-compatible engine instead"),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Run the whole pipeline on this machine and write a report."""
    extra = [*DEMO_DEFAULTS, f"policy.group_size={group_size}", *(overrides or [])]
    cfg = read_config(config, extra)
    run_id = cfg.run.name or f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    console.rule(f"[bold]Rollstream demo · run {run_id}")
    prepare(cfg)
    run_dir = cfg.state_dir / "runs" / run_id
    config_args = [*(["--config", str(config)] if config else []), *_set_args(extra)]
    port = cfg.engine.port if not engine and not port_in_use(cfg.engine.port) else _free_port()
    engine_url = engine or f"http://127.0.0.1:{port}"
    refs = task_refs(cfg.tasks_dir)[:tasks]
    with Pipeline(run_dir / "logs", config_args) as pipeline:
        start_processes(pipeline, cfg, engine_url, port, own_engine=not engine)
        requests = run_requests(run_id, refs, group_size, limits_of(cfg.policy))
        asyncio.run(submit_requests(cfg.kafka, cfg.topics, requests))
        console.print(f"submitted {len(requests)} requests: {len(refs)} tasks x {group_size} attempts")
        try:
            asyncio.run(wait_for_groups(cfg, run_id, len(refs), pipeline, timeout_s))
            asyncio.run(wait_for_sink(cfg, run_id, pipeline, timeout_s=120.0))
        except (ProcessExitedError, TimeoutError) as error:
            fail(f"{error}\nlogs: {run_dir / 'logs'}")
    summarise_run(cfg, run_id, run_dir / "report")


def prepare(cfg: Config) -> None:
    """Services and inputs: Kafka, topics, the default task set (in `cfg.tasks_dir`), the policy
    model (in `cfg.model_dir`)."""
    bootstrap = cfg.kafka.bootstrap
    if points_at_local_broker(cfg):  # a remote cluster in kafka.bootstrap is used as it is
        with console.status("starting Kafka (the first time fetches its jars from Maven Central)"):
            bootstrap = ensure_up(cfg)
    console.print(f"Kafka at {bootstrap}")
    asyncio.run(create_topics(cfg.kafka, cfg.topics))
    tasks_dir = ensure_default_tasks(cfg)
    console.print(f"tasks in {tasks_dir}")
    model_dir = cfg.model_dir
    if not (model_dir / "config.json").exists():
        with console.status("initialising the policy model"):
            init_model_dir(cfg.model, model_dir)
    console.print(f"policy model in {model_dir}")


def start_processes(pipeline: Pipeline, cfg: Config, engine_url: str, port: int, *, own_engine: bool) -> None:
    if own_engine:
        pipeline.start("engine", ["engine", "serve", "--model", str(cfg.model_dir), "--port", str(port)])
    pipeline.start("worker", ["worker"])
    pipeline.start("sink", ["sink"])
    pipeline.start(
        "rollout",
        ["rollout", "--tasks", str(cfg.tasks_dir), "--engine", engine_url, "--model", str(cfg.model_dir)],
    )  # fmt: skip
    console.print(f"processes: {', '.join(pipeline.processes)}; logs in {pipeline.log_dir}")


def _set_args(overrides: list[str]) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
