"""Trainer checkpoints: everything a restarted trainer needs to continue bit-exactly.

A checkpoint holds the backend's state (model, optimizer, RNG states), the weight
version and step, the ids of every group already taken (kept or dropped, so a
duplicate group record after the checkpoint is not trained twice), and the
consumed offsets per partition: for `groups` the position after the last group
taken into a trained batch, for `trajectories` the lowest offset still needed.
It is one `torch.save` file written to a temp file and renamed, so a kill at any
moment leaves the previous checkpoint or the new one, never half of one.

`checkpoint_path(state_dir, run_id)` is the default place; `load_checkpoint`
refuses a checkpoint of another run or another model shape with a clear error.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.model import ModelConfig

CHECKPOINT_FORMAT = 1
CHECKPOINT_FILE = "checkpoint.pt"


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message says why and what to do."""


@dataclass(frozen=True)
class Checkpoint:
    run_id: str
    mode: str  # rl | sft
    version: int
    step: int
    model_shape: dict[str, Any]  # trainer.model.ModelConfig fields, to refuse another model
    backend_state: dict[str, Any]
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)  # short topic -> partition -> offset
    taken_groups: frozenset[str] = frozenset()
    extra: dict[str, Any] = field(default_factory=dict)  # mode-specific position (SFT: epoch, index)


def checkpoint_path(state_dir: Path, run_id: str) -> Path:
    return Path(state_dir) / "trainer" / run_id / CHECKPOINT_FILE


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Write atomically: a temp file beside `path`, fsynced, then renamed over it."""
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
        "backend_state": checkpoint.backend_state,
        "offsets": checkpoint.offsets,
        "taken_groups": sorted(checkpoint.taken_groups),
        "extra": checkpoint.extra,
    }
    with open(temp, "wb") as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


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
    if not isinstance(raw, dict) or raw.get("format") != CHECKPOINT_FORMAT:
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
        backend_state=raw["backend_state"],
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
