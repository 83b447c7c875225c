"""Base -> SFT -> RL on the learning task family, through the real pipeline (bench learning, demo).

    family tasks (train, heldout) and a base model, from the seed      prepare
    expert rollouts: `rollstream rollout --policy expert` + a stream worker   collect_expert
    `rollstream replay --dataset sft` (the dataset's provenance is the log)   build_sft_model
    `rollstream train --sft` -> the SFT model                          build_sft_model
    RL: engine following `weights`, stream worker, rollout worker, trainer;   start_rl_processes
        groups submitted `learning.rl_groups_ahead` ahead of those formed    rollstream.rl_feed
    evaluations of base, SFT and RL on the held-out split              rollstream.evaluation

Every step is a real process of the pipeline started by `Supervisor`; this module only
decides what runs when. Paths are under `<state_dir>/learning/seed-<S>/`; a finished
SFT model there is reused (`ensure_sft_model`), as the demo does after its first run.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.submit import limits_of, run_requests, submit_requests, task_refs
from rollstream.command_line import new_run_id
from rollstream.config import Config, LearningSettings
from rollstream.evaluation import wait_for_engine
from rollstream.launcher.process import free_port
from rollstream.run_progress import wait_for_groups
from rollstream.supervisor import Supervisor
from sandboxes.tasks.family import FAMILY_VERSION, write_family
from streams.topics import create_topics
from trainer.checkpoint import check_model_dir, init_model_dir
from trainer.checkpoint import read_config as read_model_config
from trainer.model_sources import KNOWN_MODELS, models_dir, resolve_model

SFT_RECIPE = "sft_recipe.json"

# The family's episodes are short: caps sized to them (users' --set overrides come after).
LEARNING_DEFAULTS = (
    "policy.max_turns=4",
    "policy.max_new_tokens_per_turn=96",
    "policy.max_trajectory_tokens=256",
    "policy.context_cap=1024",
    "policy.group_size=8",
    "engine.context_length=1024",
    "rollout.concurrency=32",
    "sandbox.pool.warm_pool=4",
    "policy.max_staleness=2",
    'policy.overlong="zero"',  # a truncated episode is a failure here (garbage, loops): train on it
    "agent.temperature=0.7",
    "trainer.lr=5e-5",  # at 3e-4 seed 1 went from reading the tests to blind guesses in 5 steps
    "trainer.updates_per_step=4",
    'trainer.loss_aggregation="seq_mean_token_mean"',
    "trainer.sft_publish_every=1000000",
)


# A pretrained model of SmolLM2-135M's size on 2 CPU cores (`bench learning --model`, `demo --model`),
# after LEARNING_DEFAULTS: bf16 engine and trainer (~1.8x fp32 here), micro-batches that keep a
# 49k-vocabulary logits tensor small, and a run sized to end within 90 minutes (see docs/models.md).
PRETRAINED_DEFAULTS = (
    'engine.dtype="bfloat16"',
    'trainer.dtype="bfloat16"',
    "trainer.micro_batch_tokens=2048",
    "policy.max_new_tokens_per_turn=80",
    "policy.max_trajectory_tokens=192",
    "learning.train_tasks=64",
    "learning.heldout_tasks=64",
    "eval.attempts=4",
    "learning.sft_epochs=1",
    "trainer.sft_lr=3e-5",
    "trainer.lr=5e-6",
    "trainer.groups_per_step=4",
    "learning.rl_steps=16",
    "trainer.keep_versions=4",  # 517 MB a version: all 16 of an RL run took 8 GB
)


def learning_overrides(model: str | None) -> list[str]:
    """The settings a learning run starts from: the family's, and for a pretrained `model` its own."""
    if not model:
        return list(LEARNING_DEFAULTS)
    return [*LEARNING_DEFAULTS, *PRETRAINED_DEFAULTS, f'learning.base_model="{model}"']


class LearningError(RuntimeError):
    """A phase of the learning run failed; the message says which and where its logs are."""


@dataclass(frozen=True)
class LearningPaths:
    root: Path
    pretrained: Path | None = None  # the base model, when it is not the small one initialised per seed

    @property
    def base_model(self) -> Path:
        return self.pretrained or self.root / "base"

    @property
    def train_tasks(self) -> Path:
        return self.root / "tasks" / "train"

    @property
    def heldout_tasks(self) -> Path:
        return self.root / "tasks" / "heldout"

    @property
    def sft_model(self) -> Path:
        return self.root / "sft-model"


def learning_paths(cfg: Config) -> LearningPaths:
    """`<state_dir>/learning/seed-<S>/` for the small model, `learning/<model>/seed-<S>/` for a
    pretrained one (`learning.base_model`: a directory, or a known name under <state_dir>/models/)."""
    seed = f"seed-{cfg.learning.seed}"
    base = cfg.learning.base_model
    if not base:
        return LearningPaths(cfg.state_dir / "learning" / seed)
    path = Path(base) if Path(base).is_dir() or base not in KNOWN_MODELS else models_dir(cfg.state_dir) / base
    return LearningPaths(cfg.state_dir / "learning" / path.name / seed, pretrained=path)


def prepare(cfg: Config) -> LearningPaths:
    """Topics, both task splits and the base model for `cfg.learning.seed` (kept when present; a
    split whose recipe changed is rebuilt; an SFT model made from an old train split is stale by
    its `sft_recipe`)."""
    asyncio.run(create_topics(cfg.kafka, cfg.topics))
    paths, learning = learning_paths(cfg), cfg.learning
    for directory, split in ((paths.train_tasks, "train"), (paths.heldout_tasks, "heldout")):
        recipe = split_recipe(learning, split)
        if _kept_recipe(directory, recipe) != recipe:
            if directory.exists():
                shutil.rmtree(directory)
            write_family(directory, split, recipe["n"], learning.seed, python=cfg.tasks.python)
    if learning.base_model:
        resolve_model(learning.base_model, cfg.state_dir)  # fetched and converted on first use
        check_model_dir(paths.base_model, cfg.trainer.dtype)
    elif not (paths.base_model / "config.json").exists():
        settings = cfg.model.model_copy(update={"seed": learning.seed})
        init_model_dir(settings, paths.base_model)
    return paths


def split_recipe(learning: LearningSettings, split: str) -> dict[str, Any]:
    """What a task split is built from (`family.json` holds it)."""
    n = learning.train_tasks if split == "train" else learning.heldout_tasks
    return {"split": split, "n": n, "seed": learning.seed, "version": FAMILY_VERSION}


def _kept_recipe(directory: Path, recipe: dict[str, Any]) -> dict[str, object] | None:
    """The kept split's `family.json`, cut to the keys of `recipe` (it also lists the kinds)."""
    try:
        data = json.loads((directory / "family.json").read_text())
    except (OSError, ValueError):
        return None
    return {key: data.get(key) for key in recipe}


def collect_expert(cfg: Config, paths: LearningPaths, run_id: str, pipeline: Supervisor) -> None:
    """The scripted expert's rollouts of the train split, through a rollout worker and a stream worker."""
    pipeline.start("expert-worker", ["worker"])
    pipeline.start(
        "expert-rollout",
        [
            "rollout",
            "--policy",
            "expert",
            "--tasks",
            str(paths.train_tasks),
            "--model",
            str(paths.base_model),
        ],
    )
    refs = task_refs(paths.train_tasks)
    groups = cfg.learning.expert_groups_per_task
    requests = run_requests(
        run_id, refs, cfg.policy.group_size, limits_of(cfg.policy), groups_per_task=groups
    )
    asyncio.run(submit_requests(cfg.kafka, cfg.topics, requests))
    asyncio.run(wait_for_groups(cfg, run_id, len(refs) * groups, pipeline, cfg.learning.phase_timeout_s))


def build_sft_model(cfg: Config, paths: LearningPaths, expert_run: str, config_args: list[str]) -> Path:
    """SFT data replayed from the expert run's events, SFT on it, the last version kept as `sft_model`."""
    work = paths.root / "sft"
    if work.exists():
        shutil.rmtree(work)
    dataset = work / "sft.jsonl"
    model_arg = ["--set", f'model.path="{paths.base_model}"']
    _run_cli(
        ["replay", "--run", expert_run, "--dataset", "sft", "--out", str(dataset), *config_args, *model_arg]
    )
    sft_run = f"{expert_run}-sft"
    _run_cli(
        [
            "train",
            "--sft",
            str(dataset),
            "--out",
            str(work / "weights"),
            "--run",
            sft_run,
            "--epochs",
            str(cfg.learning.sft_epochs),
            *config_args,
            *model_arg,
        ]
    )
    last = latest_version_dir(work / "weights" / sft_run)
    staged = paths.sft_model.with_name(paths.sft_model.name + ".partial")
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(last, staged)
    (staged / SFT_RECIPE).write_text(json.dumps(sft_recipe(cfg), sort_keys=True))
    shutil.rmtree(paths.sft_model, ignore_errors=True)
    staged.rename(paths.sft_model)
    return paths.sft_model


def sft_recipe(cfg: Config) -> dict[str, object]:
    """The settings an SFT model is made from: the train split it learned from, the expert, SFT."""
    learning = cfg.learning
    return {
        "base_model": learning.base_model,
        "train_split": split_recipe(learning, "train"),
        "expert": cfg.expert.model_dump(mode="json"),
        "group_size": cfg.policy.group_size,
        "expert_groups_per_task": learning.expert_groups_per_task,
        "sft_epochs": learning.sft_epochs,
    }


def sft_model_is_current(cfg: Config, paths: LearningPaths) -> bool:
    """A kept SFT model exists and was made with today's `sft_recipe` (one made before the
    recipe was recorded counts as stale)."""
    try:
        kept = json.loads((paths.sft_model / SFT_RECIPE).read_text())
    except (OSError, ValueError):
        return False
    return (paths.sft_model / "config.json").exists() and kept == sft_recipe(cfg)


def ensure_sft_model(cfg: Config, paths: LearningPaths, log_dir: Path, config_args: list[str]) -> Path:
    """The SFT model of this seed, built through the log the first time and reused after while
    the settings it was made with (`sft_recipe`) are unchanged."""
    if sft_model_is_current(cfg, paths):
        return paths.sft_model
    expert_run = new_run_id(f"expert-seed{cfg.learning.seed}")
    with Supervisor(log_dir, config_args, cfg.supervisor) as pipeline:
        collect_expert(cfg, paths, expert_run, pipeline)
    return build_sft_model(cfg, paths, expert_run, config_args)


def latest_version_dir(run_dir: Path) -> Path:
    versions = (
        sorted(p for p in run_dir.iterdir() if p.is_dir() and p.name.isdigit()) if run_dir.is_dir() else []
    )
    if not versions:
        raise LearningError(f"no weight version was written under {run_dir}")
    return versions[-1]


def _run_cli(args: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "rollstream", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise LearningError(
            f"`rollstream {' '.join(args[:3])} ...` failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        )


def start_rl_processes(
    cfg: Config,
    paths: LearningPaths,
    run_id: str,
    start_model: Path,
    steps: int,
    pipeline: Supervisor,
    *,
    with_sink: bool,
) -> str:
    """Engine (following `weights` of `run_id`), stream worker, rollout worker, trainer; the engine URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    model_arg = ["--set", f'model.path="{start_model}"']
    pipeline.start(
        "engine",
        ["engine", "serve", "--model", str(start_model), "--port", str(port), "--follow-weights", run_id],
    )
    asyncio.run(wait_for_engine(url, cfg.eval.engine_start_timeout_s, pipeline.check_alive))
    pipeline.start("worker", ["worker"])
    if with_sink:
        pipeline.start("sink", ["sink"])
    pipeline.start(
        "rollout",
        ["rollout", "--tasks", str(paths.train_tasks), "--engine", url, "--model", str(start_model)],
    )
    trainer_args = ["train", "--run", run_id, "--steps", str(steps), *model_arg]
    pipeline.start("trainer", trainer_args, completes=True, ranks=cfg.trainer.ranks)  # torchrun when > 1
    return url


def model_version(model_dir: Path) -> int:
    return read_model_config(model_dir).weight_version
