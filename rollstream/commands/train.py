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

Data parallel: with `--ranks N` (default `trainer.ranks`) > 1 the command resolves the
model once, then execs `torchrun --standalone --nproc-per-node N --max-restarts
trainer.max_restarts -m rollstream -- train ...` (`trainer.torchrun`);
started by torchrun (also by hand, on several nodes) each rank joins the group
(`trainer.distributed.init_world`). Rank 0 is the trainer as above, the other ranks
follow its commands (`trainer.rank_group`). Every rank beats its own heartbeat file, so
a supervisor sees a hung rank (`streams.heartbeat`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import typer

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config, resolve_model_dir
from rollstream.config import Config
from streams.heartbeat import mark_rank_start, start_heartbeat
from trainer.backends import TorchBackend, TrainBackend
from trainer.checkpoint import load_model
from trainer.checkpoint import read_config as read_model_config
from trainer.compute_thread import on_compute, run_on_compute
from trainer.distributed import World, close_world, exit_finished_rank, init_world, wake_peers
from trainer.loop import RlTrainer, RunTarget, TrainerState
from trainer.publish import remove_temp_dirs, run_weights_dir
from trainer.rank_group import Channel, LeaderBackend, follow
from trainer.resume import Checkpoint, CheckpointError, checkpoint_path, load_checkpoint, restore_backend
from trainer.sft import SftDatasetError, SftPosition, SftTrainer, read_sft_dataset
from trainer.torchrun import launched_by_torchrun, torchrun_argv, torchrun_env


@dataclasses.dataclass(frozen=True)
class TrainArgs:
    """The command's own options, to hand on to torchrun's ranks unchanged."""

    config: Path | None
    overrides: tuple[str, ...]
    run: str
    steps: int | None
    sft: Path | None
    out: Path | None
    epochs: int
    checkpoint: Path | None

    def argv(self) -> list[str]:
        args = ["train", "--run", self.run, "--epochs", str(self.epochs)]
        for flag, value in (("--steps", self.steps), ("--sft", self.sft), ("--out", self.out)):
            args += [flag, str(value)] if value is not None else []
        args += ["--checkpoint", str(self.checkpoint)] if self.checkpoint is not None else []
        args += ["--config", str(self.config)] if self.config is not None else []
        return args + [arg for item in self.overrides for arg in ("--set", item)]


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
    ranks: int | None = typer.Option(
        None,
        "--ranks",
        min=1,
        help="data-parallel ranks (default trainer.ranks); > 1 execs torchrun --nproc-per-node RANKS",
    ),
) -> None:
    """Train the policy: RL on the `groups` topic, or SFT on a dataset (--sft); resumes from a checkpoint."""
    if launched_by_torchrun():
        mark_rank_start()  # a supervisor times this (re)started rank group's first beats from here
    cfg = read_config(config, overrides)
    run_id = run or cfg.run.name or ("sft" if sft else "")
    if not run_id:
        fail("no run id: pass --run RUN (or set run.name)", code=2)
    if sft is not None and out is None:
        fail("--sft needs --out DIR (where the SFT versions go)", code=2)
    args = TrainArgs(config, tuple(overrides or ()), run_id, steps, sft, out, epochs, checkpoint)
    wanted = ranks or cfg.trainer.ranks
    if wanted > 1 and not launched_by_torchrun():
        resolve_model_dir(cfg, dtype=cfg.trainer.dtype)  # fetched once here, not by every rank
        _exec_torchrun(cfg, wanted, args)
    _configure_logging(launched_by_torchrun())
    world = init_world(cfg.trainer)
    try:
        _train(cfg, world, args)
    except Exception as error:
        if world.size > 1:
            log = logging.getLogger("trainer")
            log.error("rank %d failed (%s): torchrun restarts the group", world.rank, error)
            wake_peers(world)  # a rank stopped by SIGSTOP would hold up torchrun's restart 30 s
        raise
    finally:
        close_world(world)
    if world.size > 1:
        exit_finished_rank()


def _exec_torchrun(cfg: Config, ranks: int, args: TrainArgs) -> None:
    argv = torchrun_argv(ranks, cfg.trainer.max_restarts, args.argv())
    console.print(f"starting {ranks} ranks: {' '.join(argv[1:])}")
    sys.stdout.flush()
    os.execve(sys.executable, argv, torchrun_env(dict(os.environ), ranks, cfg.trainer.torch_threads))


def _configure_logging(ranked: bool) -> None:
    where = f" rank={os.environ.get('RANK', '0')}" if ranked else ""
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s{where} %(name)s %(message)s")
    logging.getLogger("trainer").setLevel(logging.INFO)


def _train(cfg: Config, world: World, args: TrainArgs) -> None:
    sft = args.sft
    weights_dir = args.out if sft is not None and args.out is not None else cfg.weights_dir
    default_checkpoint = (
        run_weights_dir(weights_dir, args.run) / "checkpoint.pt"
        if sft is not None
        else checkpoint_path(cfg.state_dir, args.run)
    )
    target = run_target(cfg, args.run, weights_dir, args.checkpoint or default_checkpoint)
    resumed = _load_checkpoint(target, "sft" if sft is not None else "rl")
    if world.leader:
        for path in remove_temp_dirs(target.weights_dir, args.run):
            console.print(f"removed {path} (a version half-written when the trainer was killed)")
    # every torch op of this process on one thread (trainer.compute_thread: measured 2x per step)
    lr = cfg.trainer.sft_lr if sft else cfg.trainer.lr
    backend = run_on_compute(make_backend, cfg, target, lr=lr, world=world)
    state = TrainerState(version=read_model_config(target.base_dir).weight_version, step=0)
    if resumed is not None:
        try:
            run_on_compute(restore_backend, resumed, target.checkpoint, backend, world.size)
        except CheckpointError as error:
            fail(str(error))
        state = TrainerState(resumed.version, resumed.step, resumed.offsets, set(resumed.taken_groups))
        if world.leader:
            console.print(f"resumed run {args.run} at step {state.step}, version {state.version}")
    if not world.leader:
        steps = asyncio.run(_follow_until_stop(backend, world, cfg.trainer.phase_pause_s))
        logging.getLogger("trainer").info("rank %d followed %d steps", world.rank, steps)
        return
    leader: TrainBackend = backend
    if world.size > 1:
        leader = LeaderBackend(backend, Channel(world), cfg.trainer.dist_keepalive_s, state.step)
    try:
        _lead(cfg, target, leader, state, resumed, args)
    except BaseException:
        if isinstance(leader, LeaderBackend):
            leader.close(stop_followers=False)
        raise
    if isinstance(leader, LeaderBackend):
        leader.close()


def _lead(
    cfg: Config,
    target: RunTarget,
    backend: TrainBackend,
    state: TrainerState,
    resumed: Checkpoint | None,
    args: TrainArgs,
) -> None:
    if args.sft is not None:
        _run_sft(cfg, target, backend, state, resumed, args.sft, args.epochs)
        return
    trainer = RlTrainer(
        cfg.kafka,
        cfg.topics,
        cfg.trainer,
        max_staleness=cfg.policy.max_staleness,
        target=target,
        backend=backend,
        state=state,
        max_steps=args.steps,
    )
    final = asyncio.run(_until_signal(lambda stop: trainer.run(stop)))
    done = f"run {target.run_id}: step {final.step}, version {final.version}"
    console.print(f"{done}, checkpoint {target.checkpoint}")


def run_target(cfg: Config, run_id: str, weights_dir: Path, checkpoint: Path) -> RunTarget:
    """The run's paths and model: the model directory (`model.path`; its config.json is the truth),
    checked before anything trains."""
    base_dir = resolve_model_dir(cfg, dtype=cfg.trainer.dtype)
    found = read_model_config(base_dir).model
    shape: dict[str, Any] = dataclasses.asdict(found)
    return RunTarget(run_id, base_dir, weights_dir, checkpoint, found, shape)


def make_backend(cfg: Config, target: RunTarget, *, lr: float, world: World | None = None) -> TrainBackend:
    """`trainer.backend`: torch (here; FSDP2 over the ranks), or megatron-core (GPUs, under torchrun)."""
    model = load_model(target.base_dir)
    if cfg.trainer.backend == "torch":
        return TorchBackend(model, cfg.trainer, lr=lr, temperature=cfg.agent.temperature, world=world)
    from trainer.megatron_backend import MegatronBackend, MegatronUnavailable
    from trainer.megatron_parallel import LayoutError

    try:
        return MegatronBackend(model, cfg.trainer, lr=lr, temperature=cfg.agent.temperature, world=world)
    except (MegatronUnavailable, LayoutError) as error:
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


async def _follow_until_stop(backend: TrainBackend, world: World, pause_s: float) -> int:
    """A follower rank: rank 0's commands in a worker thread, the heartbeat in this loop. SIGTERM and
    SIGINT are ignored: rank 0 decides when the group stops (it checkpoints with every rank first);
    a follower whose rank 0 is gone fails in its next collective."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: None)
    start_heartbeat()
    return await on_compute(follow, backend, Channel(world), pause_s)
