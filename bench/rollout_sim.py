"""`rollstream bench rollout-sim`: the real rollout worker at high concurrency, against its bound.

The real `RolloutWorker`, bus and Kafka (topics under a fresh prefix, deleted at
the end) run the reference workload (`bench.workload`) with a simulated engine
(`agents.simulated`) and simulated sandboxes (`sandboxes.simulated`) through the
real sandbox pool: every episode writes all its events to Kafka and every
request is committed as in production. Only the model and the container are
replaced by their latencies.

Time scale: the reference episode lasts ~350 s (84% reach 80 turns), so the
scale is chosen from `--turns-per-s` (the event rate this machine can carry):
time_scale = concurrency / (mean turn time x turns-per-s). At 4096 episodes the
simulation runs slower than real time; the figures are converted back to
unscaled (workload) hours.

Measurement, over a window after `--warmup` (all slots busy by then):
- the simulated engine, sandboxes and verifier report the unscaled seconds of
  each step they complete; work done in the window / window length is the
  effective concurrency L (episodes doing useful work on average). Every
  overhead of the worker (picking up requests, writing and acking events,
  committing, CPU saturation delaying timers, a pool or client cap) lowers it;
- trajectories_per_h = L / mean episode time x 3600 (trajectory-equivalents of
  work per workload hour; counting whole completions in a one-minute window
  would measure the synchronized start, not the steady state);
- bound_per_h = concurrency / mean episode time x 3600 (Little's law with
  W = the profile's mean episode time, no overhead); ratio = the two's ratio;
- cpu_s_per_trajectory = this process's CPU seconds in the window / the
  trajectory-equivalents done in it.
Also reported: episodes finished in the window, events written, outcomes.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from agents.chat import ChatFormat
from agents.episode import EpisodeServices, EpisodeSpec
from agents.rollout import RolloutWorker
from agents.simulated import SimulatedPolicy, SimulatedTurn
from agents.submit import TaskRef, run_requests, submit_requests
from agents.worker_setup import TaskCatalog, WorkerSettings
from bench.workload import (
    EpisodePlan,
    WorkloadProfile,
    littles_law_bound_per_h,
    mean_episode_s,
    mean_turns,
    plan_episode,
    sample_verifier_s,
    scaled,
)
from rollstream.command_line import ConfigPath, Overrides, console, read_config
from rollstream.config import Config
from sandboxes.base import Sandbox
from sandboxes.pool import SandboxPool
from sandboxes.simulated import SimulatedLatency, SimulatedSandboxFactory
from sandboxes.tasks import Task, TaskMetadata, Verdict
from sandboxes.tasks.harbor import write_task_files
from streams.payloads import Limits, TrajectoryFinished
from streams.topics import create_topics, delete_topics
from trainer.tokenizer import train_tokenizer

GROUP_SIZE = 8


@dataclass
class WorkMeter:
    """Simulated steps as they begin, and episodes as they finish.

    `work_s(now)` is the unscaled work done by `now`: each step counts the part of
    its planned time that has elapsed, never more than planned, so a step that
    overruns (a late timer on a saturated CPU) earns nothing for the overrun."""

    time_scale: float
    steps: list[tuple[float, float]] = field(default_factory=list)  # (wall start, planned wall s)
    finished: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)

    def credit(self, seconds: float) -> None:
        self.steps.append((time.monotonic(), seconds * self.time_scale))

    def work_s(self, now: float) -> float:
        wall = sum(min(max(now - start, 0.0), planned) for start, planned in self.steps)
        return wall / self.time_scale

    def episode_finished(self, spec: EpisodeSpec, finished: TrajectoryFinished) -> None:
        self.finished += 1
        self.outcomes[finished.outcome.value] += 1


@dataclass(frozen=True)
class Snapshot:
    wall: float
    cpu: float
    work_s: float
    finished: int
    events: int


def command(
    concurrency: int = typer.Option(384, "--concurrency", min=1, help="episodes the worker runs at once"),
    duration: float = typer.Option(60.0, "--duration", min=5.0, help="measurement window, wall seconds"),
    warmup: float = typer.Option(15.0, "--warmup", min=0.0, help="wall seconds before the window opens"),
    turns_per_s: float = typer.Option(150.0, "--turns-per-s", min=1.0, help="turn rate the scale aims at"),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """The rollout worker at CONCURRENCY against Little's-law bound, on the reference workload."""
    cfg = read_config(config, overrides)
    base = WorkloadProfile()
    scale = concurrency / ((mean_episode_s(base) / mean_turns(base)) * turns_per_s)
    profile = WorkloadProfile(time_scale=scale)
    result = asyncio.run(_run(cfg, profile, concurrency, duration, warmup))
    print(json.dumps(result))


def bench_config(cfg: Config, concurrency: int) -> Config:
    """Fresh topics; pool caps sized to the concurrency (the caps are explicit settings)."""
    from rollstream.launcher.kafka import ensure_up

    bootstrap = ensure_up(cfg)
    return cfg.with_overrides(
        [
            f'kafka.bootstrap="{bootstrap}"',
            f'topics.prefix="bench-rollout-sim-{uuid.uuid4().hex[:8]}-"',
            f"rollout.concurrency={concurrency}",
            "rollout.drain_timeout_s=0",  # measured before the stop: episodes still running are not figures
            f"sandbox.pool.max_running={concurrency}",
            f"sandbox.pool.max_starting={concurrency}",
            "sandbox.pool.warm_pool=0",
            'sandbox.backend="simulated"',
            f"client.max_in_flight={max(concurrency, cfg.client.max_in_flight)}",
        ]
    )


def make_task_root(root: Path) -> TaskRef:
    task = Task("sim-task", root / "sim-task", "Fix the simulated bug.", None, TaskMetadata(("test_sim",)))
    write_task_files(task.dir, task, test_sh="#!/bin/bash\nexit 0\n", solve_sh="#!/bin/bash\ntrue\n")
    (task.dir / "environment" / "repo").mkdir(parents=True, exist_ok=True)
    return TaskRef(task.id, task.id)


def simulated_services(
    cfg: Config, profile: WorkloadProfile, meter: WorkMeter, pool: SandboxPool
) -> EpisodeServices:
    chat = ChatFormat.for_tokenizer(train_tokenizer(1024))

    @lru_cache(maxsize=65536)
    def plan(trajectory: str) -> EpisodePlan:
        return plan_episode(trajectory, profile)

    def script(trajectory: str, turn: int) -> SimulatedTurn:
        p = plan(trajectory)
        return SimulatedTurn(p.llm_s[min(turn, p.turns) - 1], p.submits and turn >= p.turns)

    rng = random.Random(7)

    async def verify(box: Sandbox, task: Task) -> Verdict:
        seconds = sample_verifier_s(rng, profile)
        meter.credit(seconds)
        await asyncio.sleep(scaled(seconds, profile))
        reward = 1.0 if rng.random() < profile.resolved_fraction_of_submitted else 0.0
        return Verdict(reward, {"test_sim": reward == 1.0}, {}, seconds)

    policy = SimulatedPolicy(
        chat,
        script,
        submit_command=cfg.agent.submit_command,
        time_scale=profile.time_scale,
        on_work=meter.credit,
    )
    return EpisodeServices(
        policy=policy,
        sandboxes=pool,
        verifier=verify,
        chat=chat,
        agent=cfg.agent,
        backend="simulated",
        source="bench-rollout-sim",
        command_timeout_s=cfg.sandbox.limits.command_timeout_s,
    )


async def _run(
    cfg: Config, profile: WorkloadProfile, concurrency: int, duration: float, warmup: float
) -> dict[str, object]:
    cfg = bench_config(cfg, concurrency)
    await create_topics(cfg.kafka, cfg.topics)
    meter = WorkMeter(profile.time_scale)
    latency = SimulatedLatency(
        exec_median_s=profile.tool_median_s, exec_sigma=profile.tool_sigma, time_scale=profile.time_scale
    )
    pool = SandboxPool(cfg.sandbox, SimulatedSandboxFactory(latency, seed=1, on_work=meter.credit))
    try:
        with tempfile.TemporaryDirectory(prefix="rollout-sim-tasks-") as tmp:
            task = make_task_root(Path(tmp))
            episodes_s = mean_episode_s(profile) * profile.time_scale
            needed = concurrency + math.ceil(2 * concurrency * (warmup + duration) / episodes_s) + 64
            limits = Limits(max_turns=profile.turn_cap)
            requests = run_requests(
                "bench-rollout-sim",
                [task],
                GROUP_SIZE,
                limits,
                groups_per_task=math.ceil(needed / GROUP_SIZE),
            )
            await submit_requests(cfg.kafka, cfg.topics, requests)
            async with pool:
                worker = RolloutWorker(
                    WorkerSettings(cfg.kafka, cfg.topics, cfg.rollout, cfg.policy),
                    simulated_services(cfg, profile, meter, pool),
                    TaskCatalog(Path(tmp)),
                    on_finished=meter.episode_finished,
                )
                start, end = await _measure(worker, meter, warmup, duration)
    finally:
        await _delete_topics(cfg)
    return _figures(profile, concurrency, start, end, meter, len(requests))


async def _measure(
    worker: RolloutWorker, meter: WorkMeter, warmup: float, duration: float
) -> tuple[Snapshot, Snapshot]:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))

    def snapshot() -> Snapshot:
        now, cpu = time.monotonic(), time.process_time()
        return Snapshot(now, cpu, meter.work_s(now), meter.finished, worker.events_written)

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task("warm-up", total=warmup + duration, info="")
        began = time.monotonic()
        start: Snapshot | None = None
        while (elapsed := time.monotonic() - began) < warmup + duration:
            if task.done():
                await task  # the worker failed: raise its error
            if start is None and elapsed >= warmup:
                start = snapshot()
                progress.update(bar, description="measuring")
            info = f"in flight {worker.in_flight}, finished {meter.finished}, events {worker.events_written}"
            progress.update(bar, completed=elapsed, info=info)
            await asyncio.sleep(0.5)
        end = snapshot()
    stop.set()
    await task
    assert start is not None
    return start, end


def _figures(
    profile: WorkloadProfile,
    concurrency: int,
    start: Snapshot,
    end: Snapshot,
    meter: WorkMeter,
    submitted: int,
) -> dict[str, object]:
    window_unscaled = (end.wall - start.wall) / profile.time_scale
    effective_concurrency = (end.work_s - start.work_s) / window_unscaled
    mean_s = mean_episode_s(profile)
    per_h = effective_concurrency * 3600.0 / mean_s
    bound = littles_law_bound_per_h(concurrency, profile)
    trajectories = (end.work_s - start.work_s) / mean_s
    return {
        "trajectories_per_h": round(per_h, 1),
        "bound_per_h": round(bound, 1),
        "ratio": round(per_h / bound, 4),
        "cpu_s_per_trajectory": round((end.cpu - start.cpu) / max(trajectories, 1e-9), 4),
        "concurrency": concurrency,
        "time_scale": round(profile.time_scale, 4),
        "mean_episode_s": round(mean_s, 1),
        "window_wall_s": round(end.wall - start.wall, 1),
        "finished_in_window": end.finished - start.finished,
        "events_in_window": end.events - start.events,
        "submitted": submitted,
        "outcomes": dict(meter.outcomes),
    }


async def _delete_topics(cfg: Config) -> None:
    try:
        await delete_topics(cfg.kafka, cfg.topics)
    except Exception as error:  # leftover topics under a unique prefix harm nobody
        console.print(f"[yellow]could not delete the benchmark's topics: {error!r}")
