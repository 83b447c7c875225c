"""Publishing a weight version: files first, then the events that announce them.

`write_version` writes a complete Hugging Face directory into a temp directory
under `<weights_dir>/<run>/` (the base model's tokenizer and side files, the new
weights), checksums it (`trainer.versions.directory_sha256`, the weights hashed from memory, not
read back) and renames it to
`version_dir(weights_dir, run, version)`, so an engine sees a whole version or
none. A version that already exists with the same checksum (a trainer re-doing a
step after a crash) is kept as it is; one with another checksum is an error, since
its `weights` events are already out and consumers drop a re-publish as a duplicate.
`remove_temp_dirs` clears what a kill mid-publish left behind (done at start).

The events (`version_events`, `step_event`) have deterministic ids: run, topic and
version (or step), so a re-publish after a crash is a duplicate consumers drop.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from streams.bus import EventProducer
from streams.events import Event, make_event
from streams.payloads import TrainerStep, WeightsPublished
from trainer.checkpoint import WEIGHTS_FILE, save_version_weights
from trainer.model import ModelConfig
from trainer.versions import TEMP_PREFIX, directory_sha256, version_dir

if TYPE_CHECKING:
    from trainer.loop import RunTarget

SOURCE = "trainer"


class PublishError(RuntimeError):
    """A version could not be published; the message says why and what to do."""


@dataclass(frozen=True)
class PublishedVersion:
    version: int
    path: Path
    checksum: str
    existed: bool  # already on disk with this checksum (a re-publish)


def run_weights_dir(weights_dir: Path, run_id: str) -> Path:
    return Path(weights_dir) / run_id


def remove_temp_dirs(weights_dir: Path, run_id: str) -> list[Path]:
    """Delete half-written versions (temp dirs) of `run_id`; returns what was removed."""
    root = run_weights_dir(weights_dir, run_id)
    removed = sorted(p for p in root.glob(f"{TEMP_PREFIX}*") if p.is_dir()) if root.is_dir() else []
    for path in removed:
        shutil.rmtree(path)
    return removed


def write_version(
    weights: bytes | memoryview,
    config: ModelConfig,
    *,
    base_dir: Path,
    weights_dir: Path,
    run_id: str,
    version: int,
    before_rename: Callable[[], None] | None = None,
) -> PublishedVersion:
    """Write version `version` of `run_id` (temp dir, checksum, rename); see the module docstring.
    `weights`: its `model.safetensors` (`trainer.checkpoint.version_weights`). `before_rename` runs
    once the temp dir is complete (the loop logs a phase marker there)."""
    final = version_dir(weights_dir, run_id, version)
    temp = final.with_name(f"{TEMP_PREFIX}{final.name}")
    if temp.exists():
        shutil.rmtree(temp)
    save_version_weights(weights, config, base_dir, temp, version)
    checksum = directory_sha256(temp, known={WEIGHTS_FILE: hashlib.sha256(weights).hexdigest()})
    if before_rename is not None:
        before_rename()
    if final.exists():
        existing = directory_sha256(final)
        shutil.rmtree(temp)
        if existing != checksum:
            raise PublishError(
                f"{final} already exists with sha256 {existing[:12]}…, but this trainer computed "
                f"{checksum[:12]}… for version {version}: training was not deterministic since the "
                "checkpoint (another device or thread count?). Resume where the checkpoint was written, "
                "or start a new --run"
            )
        return PublishedVersion(version, final, checksum, existed=True)
    os.rename(temp, final)
    return PublishedVersion(version, final, checksum, existed=False)


def prune_versions(weights_dir: Path, run_id: str, keep: int) -> list[Path]:
    """Delete all but the newest `keep` versions of `run_id` (a real model's version is hundreds of MB:
    an RL run of SmolLM2 wrote 8 GB in 16 steps). Engines load a version within seconds of its event,
    so keep more than `trainer.sync_every`; a trainer re-doing a step after a crash writes it anew."""
    root = run_weights_dir(weights_dir, run_id)
    versions = sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit()) if root.is_dir() else []
    removed = versions[: max(len(versions) - keep, 0)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def version_events(run_id: str, published: PublishedVersion, step: int, time_ns: int) -> tuple[Event, Event]:
    """The `weights` (compacted) and `weights.history` events of a published version."""
    data = WeightsPublished(
        version=published.version, path=str(published.path), step=step, checksum=published.checksum
    )
    weights = trainer_event(data, run_id, "weights", published.version, published.version, time_ns)
    history = trainer_event(data, run_id, "weights.history", published.version, published.version, time_ns)
    return weights, history


async def announce(producer: EventProducer, run_id: str, published: PublishedVersion, step: int) -> None:
    """Send the version's `weights` and `weights.history` events and wait until both are acked."""
    weights, history = version_events(run_id, published, step, time.time_ns())
    await producer.send("weights", weights)
    await producer.send("weights.history", history)
    await producer.flush()


def step_event(run_id: str, data: TrainerStep, time_ns: int) -> Event:
    """The `trainer.steps` event of a step (id from run and step)."""
    return trainer_event(data, run_id, "trainer.steps", data.step, data.version, time_ns)


def trainer_event(
    data: WeightsPublished | TrainerStep, run_id: str, topic: str, seq: int, version: int, time_ns: int
) -> Event:
    """An event the trainer writes: its id comes from (run, topic, seq) alone, so a trainer redoing
    a step after a crash writes the same ids and consumers drop the repeat."""
    return make_event(
        data,
        run_id=run_id,
        seq=seq,
        time_ns=time_ns,
        source=SOURCE,
        policy_version=version,
        id_key=f"{run_id}/{topic}",
    )


async def publish_version(
    producer: EventProducer,
    target: RunTarget,
    weights: bytes | memoryview,
    *,
    step: int,
    version: int,
    before_rename: Callable[[], None] | None = None,
    keep: int = 0,
) -> None:
    """Write `weights` (`trainer.loop.version_file`) as `version` of the run in a worker thread (no
    torch work there, see `trainer.compute_thread`; the loop keeps its heartbeat), then announce it
    (RL and SFT); with `keep` > 0, only the newest `keep` versions of the run stay on disk
    (`trainer.keep_versions`)."""
    published = await asyncio.to_thread(
        write_version,
        weights,
        target.model_config,
        base_dir=target.base_dir,
        weights_dir=target.weights_dir,
        run_id=target.run_id,
        version=version,
        before_rename=before_rename,
    )
    await announce(producer, target.run_id, published, step)
    if keep:
        prune_versions(target.weights_dir, target.run_id, keep)
