"""Supervised fine-tuning with the RL trainer's machinery (`rollstream train --sft DATASET`).

The dataset is what `rollstream replay --dataset sft` writes (`streams.datasets.
sft_rows`): one row per resolved trajectory with `input_ids` and `loss_mask`;
`read_sft_dataset` loads .jsonl or .parquet and refuses anything else with a clear
error. Training is cross-entropy on loss-masked tokens only (`TrainBackend.
sft_step`), `trainer.sft_batch_sequences` rows per step in file order, `epochs`
passes; every step writes a `trainer.steps` event (mode `sft`), and every
`trainer.sft_publish_every`-th step and the last a version, as RL does
(`trainer.publish`), so a run goes base -> SFT -> RL: the last SFT version is a
model directory RL can start from. Checkpoints (`trainer.resume`, mode `sft`) hold
the position (epoch, row) and resume bit-exactly too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streams.bus import EventProducer
from streams.packed import pack, unpack
from streams.settings import KafkaSettings, TopicSettings
from trainer.backends import TrainBackend
from trainer.compute_thread import on_compute, run_on_compute
from trainer.loop import RunTarget, TrainerState, save_run_checkpoint, version_file
from trainer.publish import publish_version, step_event
from trainer.settings import TrainerSettings
from trainer.step import SftSequence
from trainer.step_payload import step_payload, step_times
from trainer.weights_stage import WeightsStage

log = logging.getLogger(__name__)
SFT_COLUMNS = ("input_ids", "loss_mask")


class SftDatasetError(ValueError):
    """A file that is not an SFT dataset; the message says what is wrong and how to make one."""


def read_sft_dataset(path: Path, vocab_size: int) -> list[SftSequence]:
    """The rows of an SFT dataset as sequences, checked: columns, lengths, mask values, token range."""
    path = Path(path)
    if not path.is_file():
        raise SftDatasetError(f"{path} does not exist; write one with `rollstream replay --dataset sft`")
    rows = _rows(path)
    if not rows:
        raise SftDatasetError(f"{path} has no rows; a run with resolved trajectories makes a non-empty one")
    return [_sequence(path, index, row, vocab_size) for index, row in enumerate(rows)]


def _rows(path: Path) -> list[dict[str, Any]]:
    hint = "; write one with `rollstream replay --dataset sft --out FILE.jsonl|.parquet`"
    if path.suffix == ".jsonl":
        try:
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise SftDatasetError(f"{path} is not JSON lines ({error}){hint}") from None
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path, columns=list(SFT_COLUMNS)).to_pylist()
        except Exception as error:  # pyarrow raises several kinds for a bad or foreign file
            raise SftDatasetError(f"{path} is not an SFT parquet dataset ({error}){hint}") from None
    raise SftDatasetError(f"{path}: unknown format {path.suffix!r}, expected .jsonl or .parquet{hint}")


def _sequence(path: Path, index: int, row: Any, vocab_size: int) -> SftSequence:
    where = f"{path} row {index}"
    if not isinstance(row, dict) or any(c not in row for c in SFT_COLUMNS):
        raise SftDatasetError(
            f"{where} has no {' and '.join(SFT_COLUMNS)}: not an SFT dataset "
            "(`rollstream replay --dataset sft` writes one)"
        )
    ids, mask = row["input_ids"], row["loss_mask"]
    if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask) or len(ids) < 2:
        raise SftDatasetError(f"{where}: input_ids and loss_mask must be lists of one length >= 2")
    if any(m not in (0, 1) for m in mask) or not any(mask[1:]):
        raise SftDatasetError(f"{where}: loss_mask must be 0/1 with at least one 1 after the first token")
    if any(not isinstance(t, int) or not 0 <= t < vocab_size for t in ids):
        raise SftDatasetError(f"{where}: token ids must be integers in [0, {vocab_size}) (model.vocab_size)")
    return SftSequence(token_ids=unpack(pack(ids, "i"), "i"), loss_mask=unpack(pack(mask, "b"), "b"))


@dataclass(frozen=True)
class SftPosition:
    epoch: int
    index: int  # next row of the epoch


def sft_batches(
    count: int, batch_size: int, epochs: int, start: SftPosition
) -> list[tuple[SftPosition, range]]:
    """The (position after, rows) of every step from `start` on: file order, last batch of an epoch short."""
    out = []
    epoch, index = start.epoch, start.index
    while epoch < epochs:
        rows = range(index, min(index + batch_size, count))
        index = rows.stop
        if index >= count:
            epoch, index = epoch + 1, 0
        out.append((SftPosition(epoch, index), rows))
    return out


class SftTrainer:
    """Trains `epochs` passes over `sequences`, publishing like the RL loop."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        settings: TrainerSettings,
        *,
        target: RunTarget,
        backend: TrainBackend,
        state: TrainerState,
        position: SftPosition,
    ) -> None:
        self.kafka, self.topics, self.settings = kafka, topics, settings
        self.target, self.backend, self.state, self.position = target, backend, state, position
        self.losses: list[float] = []
        self.stage = WeightsStage()  # publishes are awaited in the step: one version at a time

    async def run(self, sequences: list[SftSequence], epochs: int, stop: asyncio.Event) -> TrainerState:
        async with EventProducer(self.kafka, self.topics) as producer:
            batches = sft_batches(len(sequences), self.settings.sft_batch_sequences, epochs, self.position)
            for number, (after, rows) in enumerate(batches, start=1):
                if stop.is_set():
                    break
                last = number == len(batches)
                publish = last or (self.state.step + 1) % self.settings.sft_publish_every == 0
                await self._step([sequences[i] for i in rows], producer, publish=publish)
                self.position = after
                if self.state.step % self.settings.checkpoint_every == 0:
                    self.save()
        self.save()
        return self.state

    async def _step(self, batch: list[SftSequence], producer: EventProducer, *, publish: bool) -> None:
        metrics = await on_compute(self.backend.sft_step, batch)  # the loop keeps beating
        self.state.step += 1
        started = time.monotonic()
        if publish:  # a version per published step; the steps between train on
            self.state.version += 1
            await publish_version(
                producer,
                self.target,
                await on_compute(version_file, self.backend, self.target, self.stage),
                step=self.state.step,
                version=self.state.version,
                keep=self.settings.keep_versions,
            )
        publish_s = time.monotonic() - started
        data = step_payload(
            metrics,
            step=self.state.step,
            version=self.state.version,
            group_ids=[],
            seen=Counter(),
            staleness_mean=0.0,
            staleness_max=0,
            times=step_times(metrics, publish_s),
            mode="sft",
        )
        await producer.send("trainer.steps", step_event(self.target.run_id, data, time.time_ns()))
        await producer.flush()
        self.losses.append(metrics.loss)
        log.info(
            "sft step=%d version=%d loss=%.4f tokens=%d", data.step, data.version, data.loss, data.tokens
        )

    def save(self) -> None:
        run_on_compute(
            save_run_checkpoint,
            self.target,
            self.state,
            self.backend,
            mode="sft",
            extra={"epoch": self.position.epoch, "index": self.position.index},
        )
