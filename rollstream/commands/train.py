"""`rollstream train`: the GRPO trainer on Kafka, or SFT on a dataset with the same code.

RL (`--run RUN [--steps N]`): consumes `groups` and `trajectories`, trains a step per
`trainer.groups_per_step` kept groups, writes each version under
`<state_dir>/weights/RUN/` and announces it on `weights` / `weights.history`, with the
step on `trainer.steps` (see `trainer.loop`). It resumes from its checkpoint
(`<state_dir>/trainer/RUN/checkpoint.pt`) after any crash; SIGTERM (or Ctrl-C)
checkpoints and exits 0.

SFT (`--sft DATASET --out DIR [--epochs E]`): trains on a dataset written by
`rollstream replay --dataset sft`; versions go under `DIR/RUN/`, the checkpoint to
`DIR/RUN/checkpoint.pt`, steps to `trainer.steps` (see `trainer.sft`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from pathlib import Path
from typing import Any

import typer

from rollstream.commands.common import ConfigPath, Overrides, console, fail, read_config, resolve_model_dir
from rollstream.config import Config
from streams.heartbeat import start_heartbeat
from trainer.backends import TorchBackend, TrainBackend
from trainer.checkpoint import load_model
from trainer.checkpoint import read_config as read_model_config
from trainer.loop import RlTrainer, RunTarget, TrainerState
from trainer.publish import remove_temp_dirs, run_weights_dir
from trainer.resume import Checkpoint, CheckpointError, checkpoint_path, load_checkpoint
from trainer.sft import SftDatasetError, SftPosition, SftTrainer, read_sft_dataset


def command(
    config: ConfigPath = None,
    overrides: Overrides = None,
    run: str = typer.Option(
        "", "--run", help="run id: names the versions, checkpoint and events (default run.name)"
    ),
    steps: int | None = typer.Option(
        None, "--steps", min=1, help="stop (with a checkpoint) once this many steps are trained in total"
    ),
    sft: Path | None = typer.Option(
        None,
        "--sft",
        help="SFT instead of RL: a .jsonl/.parquet dataset from `rollstream replay --dataset sft`",
    ),
    out: Path | None = typer.Option(None, "--out", help="SFT: directory for the versions and the checkpoint"),
    epochs: int = typer.Option(1, "--epochs", min=1, help="SFT: passes over the dataset"),
    checkpoint: Path | None = typer.Option(
        None,
        "--checkpoint",
        help="checkpoint file (default <state_dir>/trainer/RUN/checkpoint.pt; SFT: DIR/RUN/)",
    ),
) -> None:
    """Train the policy: RL on the `groups` topic, or SFT on a dataset (--sft); resumes from a checkpoint."""
    cfg = read_config(config, overrides)
    run_id = run or cfg.run.name or ("sft" if sft else "")
    if not run_id:
        fail("no run id: pass --run RUN (or set run.name)", code=2)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("trainer").setLevel(logging.INFO)
    if sft is not None and out is None:
        fail("--sft needs --out DIR (where the SFT versions go)", code=2)
    weights_dir = out if sft is not None and out is not None else cfg.weights_dir
    default_checkpoint = (
        run_weights_dir(weights_dir, run_id) / "checkpoint.pt"
        if sft is not None
        else checkpoint_path(cfg.state_dir, run_id)
    )
    target = run_target(cfg, run_id, weights_dir, checkpoint or default_checkpoint)
    mode = "sft" if sft is not None else "rl"
    resumed = _load_checkpoint(target, mode)
    for path in remove_temp_dirs(target.weights_dir, run_id):
        console.print(f"removed {path} (a version half-written when the trainer was killed)")
    backend = make_backend(cfg, target, lr=cfg.trainer.sft_lr if sft else cfg.trainer.lr)
    state = TrainerState(version=read_model_config(target.base_dir).weight_version, step=0)
    if resumed is not None:
        backend.restore_state(resumed.backend_state)
        state = TrainerState(resumed.version, resumed.step, resumed.offsets, set(resumed.taken_groups))
        console.print(f"resumed run {run_id} at step {state.step}, version {state.version}")
    if sft is not None:
        _run_sft(cfg, target, backend, state, resumed, sft, epochs)
        return
    trainer = RlTrainer(
        cfg.kafka,
        cfg.topics,
        cfg.trainer,
        max_staleness=cfg.policy.max_staleness,
        target=target,
        backend=backend,
        state=state,
        max_steps=steps,
    )
    final = asyncio.run(_until_signal(lambda stop: trainer.run(stop)))
    console.print(f"run {run_id}: step {final.step}, version {final.version}, checkpoint {target.checkpoint}")


def run_target(cfg: Config, run_id: str, weights_dir: Path, checkpoint: Path) -> RunTarget:
    """The run's paths and model: the model directory (`model.path`; its config.json is the truth),
    checked before anything trains."""
    base_dir = resolve_model_dir(cfg, dtype=cfg.trainer.dtype)
    found = read_model_config(base_dir).model
    shape: dict[str, Any] = dataclasses.asdict(found)
    return RunTarget(run_id, base_dir, weights_dir, checkpoint, found, shape)


def make_backend(cfg: Config, target: RunTarget, *, lr: float) -> TrainBackend:
    """`trainer.backend`: torch (here), or megatron-core (GPUs, under torchrun)."""
    model = load_model(target.base_dir)
    if cfg.trainer.backend == "torch":
        return TorchBackend(model, cfg.trainer, lr=lr, temperature=cfg.agent.temperature)
    from trainer.megatron_backend import MegatronBackend, MegatronUnavailable

    try:
        return MegatronBackend(model, cfg.trainer, lr=lr, temperature=cfg.agent.temperature)
    except MegatronUnavailable as error:
        fail(str(error))


def _load_checkpoint(target: RunTarget, mode: str) -> Checkpoint | None:
    try:
        return load_checkpoint(
            target.checkpoint, run_id=target.run_id, mode=mode, model_shape=target.model_shape
        )
    except CheckpointError as error:
        fail(str(error))


def _run_sft(
    cfg: Config,
    target: RunTarget,
    backend: TrainBackend,
    state: TrainerState,
    resumed: Checkpoint | None,
    dataset: Path,
    epochs: int,
) -> None:
    try:
        sequences = read_sft_dataset(dataset, target.model_config.vocab_size)
    except SftDatasetError as error:
        fail(str(error))
    extra = resumed.extra if resumed is not None else {}
    position = SftPosition(int(extra.get("epoch", 0)), int(extra.get("index", 0)))
    trainer = SftTrainer(
        cfg.kafka, cfg.topics, cfg.trainer, target=target, backend=backend, state=state, position=position
    )
    final = asyncio.run(_until_signal(lambda stop: trainer.run(sequences, epochs, stop)))
    losses = trainer.losses
    summary = f"loss {losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "nothing left to train"
    console.print(f"sft {target.run_id}: step {final.step}, version {final.version}, {summary}")


async def _until_signal(start: Any) -> TrainerState:
    """Run `start(stop)` with SIGINT/SIGTERM setting `stop` (the trainer checkpoints and returns)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    start_heartbeat()  # beats from the trainer's loop; a step blocks it (keep hung_after_s above a step)
    result: TrainerState = await start(stop)
    return result
