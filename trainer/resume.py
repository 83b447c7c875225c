"""Trainer checkpoints: everything a restarted trainer needs to continue bit-exactly.

A checkpoint is two things beside each other:
- the backend's state (model and optimizer) in a directory `<checkpoint>.state-<step>`,
  written by every rank together (`TrainBackend.save_state`: a
  `torch.distributed.checkpoint`, sharded as the ranks hold it, resharded on load to
  another world size);
- the manifest at `<checkpoint>` (one small `torch.save` file, written by rank 0 alone):
  the run, weight version and step, the ids of every group already taken (kept or
  dropped, so a duplicate group record after the checkpoint is not trained twice), the
  consumed offsets per partition (for `groups` the position after the last group taken
  into a trained batch, for `trajectories` the lowest offset still needed), the state
  directory's name, its kind (`TrainBackend.state_kind`) and every rank's RNG states.

Commit order: the state directory is written in full first, then the manifest naming it
goes to a temp file, fsynced and renamed over the old one, then older state directories
are removed. A kill at any moment leaves the previous checkpoint or the new one, never
half of one. Format 1 (one file with the whole backend state) is still read, by one process.

`checkpoint_path(state_dir, run_id)` is the default place; `load_checkpoint`
refuses a checkpoint of another run or another model shape with a clear error.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.model import ModelConfig

CHECKPOINT_FORMAT = 2
LEGACY_FORMAT = 1  # the whole backend state inside the manifest
CHECKPOINT_FILE = "checkpoint.pt"
STATE_INFIX = ".state-"


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message says why and what to do."""


@dataclass(frozen=True)
class Checkpoint:
    run_id: str
    mode: str  # rl | sft
    version: int
    step: int
    model_shape: dict[str, Any]  # trainer.model.ModelConfig fields, to refuse another model
    state: str = ""  # the state directory's name, beside the manifest
    state_kind: str = ""  # TrainBackend.state_kind of the backend that wrote it
    rng: list[dict[str, Any]] = field(default_factory=list)  # every rank's RNG states, by rank
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)  # short topic -> partition -> offset
    taken_groups: frozenset[str] = frozenset()
    extra: dict[str, Any] = field(default_factory=dict)  # mode-specific position (SFT: epoch, index)
    legacy_backend_state: dict[str, Any] | None = None  # format 1: the whole state in the manifest

    def state_dir(self, manifest: Path) -> Path:
        return Path(manifest).parent / self.state


def checkpoint_path(state_dir: Path, run_id: str) -> Path:
    return Path(state_dir) / "trainer" / run_id / CHECKPOINT_FILE


def state_dir_for(path: Path, step: int) -> Path:
    """Where the backend state of the checkpoint at `path` taken after `step` goes."""
    path = Path(path)
    return path.with_name(f"{path.name}{STATE_INFIX}{step:06d}")


def fresh_state_dir(path: Path, step: int) -> Path:
    """`state_dir_for`, emptied of what an interrupted save of the same step left (rank 0, before
    the ranks write it)."""
    directory = state_dir_for(path, step)
    if directory.exists():
        shutil.rmtree(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    return directory


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Commit the manifest atomically (a temp file beside `path`, fsynced, renamed over it) once its
    state directory is complete; then remove the state directories it no longer names."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(path.name + ".tmp")
    payload = {
        "format": CHECKPOINT_FORMAT,
        "run_id": checkpoint.run_id,
        "mode": checkpoint.mode,
        "version": checkpoint.version,
        "step": checkpoint.step,
        "model_shape": checkpoint.model_shape,
        "state": checkpoint.state,
        "state_kind": checkpoint.state_kind,
        "rng": checkpoint.rng,
        "offsets": checkpoint.offsets,
        "taken_groups": sorted(checkpoint.taken_groups),
        "extra": checkpoint.extra,
    }
    with open(temp, "wb") as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)
    for stale in path.parent.glob(f"{path.name}{STATE_INFIX}*"):
        if stale.name != checkpoint.state and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)


def load_checkpoint(path: Path, *, run_id: str, mode: str, model_shape: dict[str, Any]) -> Checkpoint | None:
    """The checkpoint at `path` (None when there is none yet), checked against this run."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        raw = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        raise CheckpointError(
            f"{path} is not a trainer checkpoint ({error}); move it away to start fresh"
        ) from None
    if not isinstance(raw, dict) or raw.get("format") not in (CHECKPOINT_FORMAT, LEGACY_FORMAT):
        raise CheckpointError(f"{path} is not a trainer checkpoint of format {CHECKPOINT_FORMAT}")
    if raw["run_id"] != run_id:
        raise CheckpointError(
            f"{path} is a checkpoint of run {raw['run_id']!r}, not of run {run_id!r}: "
            "pass the right --run, or another --checkpoint for a new run"
        )
    if raw["mode"] != mode:
        raise CheckpointError(f"{path} is a {raw['mode']} checkpoint; this is a {mode} run")
    if not same_shape(raw["model_shape"], model_shape):
        raise CheckpointError(
            f"{path} was written for model {raw['model_shape']}, but the model is {model_shape}: "
            "point --set model.path at the model this run started from"
        )
    return Checkpoint(
        run_id=raw["run_id"],
        mode=raw["mode"],
        version=int(raw["version"]),
        step=int(raw["step"]),
        model_shape=raw["model_shape"],
        state=raw.get("state", ""),
        state_kind=raw.get("state_kind", ""),
        rng=list(raw.get("rng", [])),
        legacy_backend_state=raw["backend_state"] if raw["format"] == LEGACY_FORMAT else None,
        offsets={
            topic: {int(p): int(o) for p, o in parts.items()} for topic, parts in raw["offsets"].items()
        },
        taken_groups=frozenset(raw["taken_groups"]),
        extra=dict(raw.get("extra", {})),
    )


def same_shape(recorded: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether a checkpoint's recorded model shape is the current one. Fields the recording predates
    (added to `ModelConfig` later: head_dim, biases, tying, ...) count as equal when the current model
    has their default, so checkpoints of older runs of the same model still resume."""
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    head_dim = current.get("hidden_size", 0) // max(int(current.get("num_heads", 1)), 1)
    defaults["head_dim"] = head_dim
    return all(
        recorded[key] == value if key in recorded else value == defaults.get(key)
        for key, value in current.items()
    ) and set(recorded) <= set(current)


def restore_backend(checkpoint: Checkpoint, manifest: Path, backend: Any, world_size: int) -> None:
    """Load `checkpoint`'s backend state into `backend` (`trainer.backends.TrainBackend`), every rank
    together; a CheckpointError saying what to do when it does not fit."""
    if checkpoint.legacy_backend_state is not None:
        restore = getattr(backend, "restore_legacy_state", None)
        if restore is None or world_size != 1:
            raise CheckpointError(
                f"{manifest} is a format-{LEGACY_FORMAT} checkpoint (one file, one process): resume it once "
                "with trainer.ranks = 1 and the torch backend; its next checkpoint has the current format"
            )
        try:
            restore(checkpoint.legacy_backend_state)
        except ValueError as error:
            raise CheckpointError(f"{manifest}: {error}") from None
        return
    if checkpoint.state_kind != backend.state_kind:
        raise CheckpointError(
            f"{manifest}'s state was written by a {checkpoint.state_kind!r} backend, this trainer's is "
            f"{backend.state_kind!r} (trainer.backend, trainer.lora or the megatron parallel sizes changed): "
            "resume with the settings it was written with, or start a new --run"
        )
    directory = checkpoint.state_dir(manifest)
    if not directory.is_dir():
        raise CheckpointError(
            f"{manifest} names the state directory {directory}, which is missing: copy it back beside the "
            "manifest (every node needs both), or move the manifest away to start fresh"
        )
    backend.load_state(directory, checkpoint.rng)
