"""The RL trainer on Kafka (`rollstream train`): `groups` + `trajectories` in; versions and steps out.

One process reads every partition of `groups` and of `trajectories` (assigned by
hand, no consumer group: the checkpoint, not Kafka, holds its offsets). Groups are
taken in the deterministic cross-partition order of `trainer.ordering`; each is
judged (`trainer.intake.judge_group`): dropped by the stream policies or stale at
the trainer's version means counted, not trained; a kept group is joined with
its member trajectories by id (both topics are keyed by group id, but the
trajectory may still be on its way: the trainer reads `trajectories` until the
members are there, never waiting for a particular rollout to finish). When
`trainer.groups_per_step` kept groups are in, the backend trains one step and hands
a snapshot of its weights to the background publisher (`trainer.background_publish`):
the new version is written (`trainer.publish`) and announced on `weights` and
`weights.history`, then the step's metrics go to `trainer.steps`, with what the wait
before it was for (`trainer.waits`: no next group yet, a group's trajectories not read
yet, and the machine's CPU use meanwhile), while the next step collects and trains.
Versions and step events still go out in order: a step's snapshot is taken only once
the version before it is out, and a checkpoint is written only once every version up
to its step is (measured: writing and hashing SmolLM2's 538 MB on the step's path
cost 0.15 of its time; `bench trainer --model`). The consumers'
background prefetching is paused while a step trains and publishes (measured: it
slowed torch's threads on a 2-core machine; `bench trainer`).

Resume: every `trainer.checkpoint_every` steps, when `--steps` is reached and on
SIGTERM, a checkpoint (`trainer.resume`) records the state as of the end of the
last step: model, optimizer, RNG, version, step, the groups taken so far and the
offsets (groups: after the last group taken into a trained batch; trajectories:
the lowest still needed). A trainer killed at any moment restarts from it, reads
again what it had consumed since, and, the order being a function of the log,
trains on the same groups in the same batches; re-published versions are
identical (deterministic event ids, same checksum).

Each phase is logged as `phase=<name> step=<n> version=<v>` (`update`, `publish`,
`publish.rename`, `between`); `trainer.phase_pause_s` (a test hook, 0 by default)
sleeps after each marker so a test can kill the process inside a phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from streams.bus import EventConsumer, EventProducer
from streams.events import Event
from streams.payloads import GroupFormed, TrainerStep, TrajectoryAssembled
from streams.settings import KafkaSettings, TopicSettings
from streams.topics import partitions, topic_name
from trainer.backends import TrainBackend
from trainer.background_publish import BackgroundPublisher
from trainer.batch import GroupMismatchError, KeptGroup, StepBatch, samples_of
from trainer.checkpoint import stage_version_weights
from trainer.compute_thread import on_compute
from trainer.intake import TRAIN, TrajectoryBuffer, batch_staleness, judge_group
from trainer.model import ModelConfig
from trainer.ordering import PartitionMerger
from trainer.publish import publish_version, step_event
from trainer.resume import Checkpoint, fresh_state_dir, save_checkpoint
from trainer.settings import TrainerSettings
from trainer.step_payload import step_payload, step_times
from trainer.waits import WaitClock, WaitSplit
from trainer.weights_stage import WeightsStage

log = logging.getLogger(__name__)
WAIT_LOG_S = 30.0  # how often a wait for missing member trajectories is reported


@dataclass(frozen=True)
class RunTarget:
    """Where a run's versions and checkpoint go, and what it starts from."""

    run_id: str
    base_dir: Path  # the model directory: tokenizer and side files of every version
    weights_dir: Path
    checkpoint: Path
    model_config: ModelConfig
    model_shape: dict[str, object]


@dataclass
class TrainerState:
    version: int
    step: int
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    taken_groups: set[str] = field(default_factory=set)


def save_run_checkpoint(
    target: RunTarget, state: TrainerState, backend: TrainBackend, *, mode: str, **position: Any
) -> None:
    """Checkpoint the run as of the end of its last step (`trainer.resume`: the backend state by
    every rank, then the manifest by this one); `position` is the mode's own (RL: offsets and
    taken groups; SFT: `extra` with epoch and index)."""
    directory = fresh_state_dir(target.checkpoint, state.step)
    rng = backend.save_state(directory)
    save_checkpoint(
        target.checkpoint,
        Checkpoint(
            run_id=target.run_id,
            mode=mode,
            version=state.version,
            step=state.step,
            model_shape=target.model_shape,
            state=directory.name,
            state_kind=backend.state_kind,
            rng=rng,
            **position,
        ),
    )


def version_file(backend: TrainBackend, target: RunTarget, stage: WeightsStage) -> memoryview:
    """The `model.safetensors` of the backend's weights as a new version of the run (RL and SFT), laid
    out in `stage` (valid until its next use): torch work, so it runs on the compute thread;
    collective under torchrun."""
    tensors = backend.hf_state_dict(copy=False)  # copied into the stage before the next step
    return stage_version_weights(stage, tensors, target.model_config, target.base_dir)


class RlTrainer:
    """`await trainer.run(stop)`: train until `max_steps` (total) or `stop` is set."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        settings: TrainerSettings,
        *,
        max_staleness: int,
        target: RunTarget,
        backend: TrainBackend,
        state: TrainerState,
        max_steps: int | None = None,
    ) -> None:
        self.kafka, self.topics, self.settings = kafka, topics, settings
        self.max_staleness, self.target, self.backend = max_staleness, target, backend
        self.state, self.max_steps = state, max_steps
        group_parts = range(partitions(topics, "groups"))
        traj_parts = range(partitions(topics, "trajectories"))
        self.merger: PartitionMerger[Event] = PartitionMerger(
            {p: state.offsets.get("groups", {}).get(p, 0) for p in group_parts}
        )
        self.trajectory_positions = {p: state.offsets.get("trajectories", {}).get(p, 0) for p in traj_parts}
        self.buffer = TrajectoryBuffer(settings.trajectory_buffer)
        self.exhausted: set[int] = set()
        self.seen: Counter[str] = Counter()  # verdicts since the last step
        self.saved_step = state.step
        self.publisher = BackgroundPublisher()
        self.stage = WeightsStage()  # each version laid out here; free again once it is drained

    async def run(self, stop: asyncio.Event) -> TrainerState:
        if self.max_steps is not None and self.state.step >= self.max_steps:
            return self.state  # resumed at its last step (restarted after it finished): nothing to read
        async with (
            EventProducer(self.kafka, self.topics) as producer,
            self._consumer("groups") as groups,
            self._consumer("trajectories") as trajectories,
        ):
            await self._seek(groups, "groups", self.merger.taken_positions())
            await self._seek(trajectories, "trajectories", self.trajectory_positions)
            try:
                await self._steps(stop, producer, groups, trajectories)
                if self.state.step != self.saved_step:
                    await self.save()
            finally:
                await self.publisher.close()  # only a publish cut off by an error is still pending
        return self.state

    async def _steps(
        self, stop: asyncio.Event, producer: EventProducer, groups: EventConsumer, trajectories: EventConsumer
    ) -> None:
        while not stop.is_set() and (self.max_steps is None or self.state.step < self.max_steps):
            clock = WaitClock()
            batch = await self._collect(stop, groups, trajectories, clock)
            if batch is None:
                break
            with _paused(groups, trajectories):  # no prefetching beside the update's threads
                await self._train(batch, clock.finish(), producer)
            if self.state.step % self.settings.checkpoint_every == 0:
                await self.save()
            self._phase("between")

    async def save(self) -> None:
        """Checkpoint the end of the last step, once its version is out (`trainer.background_publish`)."""
        await self.publisher.drain()
        await on_compute(self._save)

    def _save(self) -> None:
        save_run_checkpoint(
            self.target,
            self.state,
            self.backend,
            mode="rl",
            offsets=self.state.offsets,
            taken_groups=frozenset(self.state.taken_groups),
        )
        self.saved_step = self.state.step
        log.info("checkpoint step=%d version=%d %s", self.state.step, self.state.version, self.state.offsets)

    def _consumer(self, short: str) -> EventConsumer:
        return EventConsumer(
            self.kafka, self.topics, [short], group_id=None, name=f"trainer-{short}", subscribe=False
        )

    async def _seek(self, consumer: EventConsumer, short: str, start: dict[int, int]) -> None:
        name = topic_name(self.topics, short)
        tps = {p: TopicPartition(name, p) for p in start}
        consumer.consumer.assign(list(tps.values()))
        for p, offset in start.items():
            consumer.consumer.seek(tps[p], offset)

    async def _collect(
        self, stop: asyncio.Event, groups: EventConsumer, trajectories: EventConsumer, clock: WaitClock
    ) -> StepBatch | None:
        """The next batch of kept groups with their samples, in order; None once `stop` is set."""
        batch: list[KeptGroup] = []
        in_batch: set[str] = set()
        while len(batch) < self.settings.groups_per_step:
            if stop.is_set():
                return None
            taken = self.merger.take(self.exhausted)
            if taken is None:
                with clock.waiting_for("groups"):
                    await self._fetch_groups(groups)
                continue
            event = taken.item
            group_id = event.group_id or ""
            if group_id in self.state.taken_groups or group_id in in_batch:
                continue  # a re-emitted copy of a group already taken
            in_batch.add(group_id)
            group = event.data
            assert isinstance(group, GroupFormed)
            verdict = judge_group(group, self.state.version, self.max_staleness)
            if verdict != TRAIN:
                self.seen[verdict] += 1
                self.buffer.take(group.members)
                continue
            with clock.waiting_for("trajectories"):
                members = await self._members(group, group_id, trajectories, stop)
            if members is None:
                return None
            try:
                batch.append(KeptGroup(event, tuple(samples_of(group, members, group_id))))
            except GroupMismatchError as error:  # bad data never trains, and must not stop the run
                self.seen["malformed"] += 1
                log.warning("group %s skipped: %s", group_id, error)
        self.state.taken_groups |= in_batch
        return StepBatch(tuple(batch))

    async def _fetch_groups(self, groups: EventConsumer) -> None:
        for record in await groups.batch(timeout_ms=self.settings.poll_ms, max_records=10_000):
            if record.event.run_id == self.target.run_id and isinstance(record.event.data, GroupFormed):
                self.merger.add(record.partition, record.offset, record.event.time_ns, record.event)
                self.exhausted.discard(record.partition)  # at its end again only once re-checked
        empty = self.merger.empty_partitions()
        if not empty:
            return
        name = topic_name(self.topics, "groups")
        tps = [TopicPartition(name, p) for p in empty]
        ends = await groups.consumer.end_offsets(tps)
        self.exhausted = {tp.partition for tp in tps if await groups.consumer.position(tp) >= ends[tp]}

    async def _members(
        self, group: GroupFormed, group_id: str, trajectories: EventConsumer, stop: asyncio.Event
    ) -> dict[str, TrajectoryAssembled] | None:
        """The member trajectories of a kept group, reading `trajectories` until they are all there."""
        last_report = time.monotonic()
        while missing := self.buffer.missing(group.members):
            if stop.is_set():
                return None
            for record in await trajectories.batch(timeout_ms=self.settings.poll_ms, max_records=10_000):
                event, data = record.event, record.event.data
                self.trajectory_positions[record.partition] = record.offset + 1
                if event.run_id != self.target.run_id or not isinstance(data, TrajectoryAssembled):
                    continue
                if event.group_id in self.state.taken_groups:
                    continue  # its group was trained or dropped already (read again after a restart)
                self.buffer.add(event.trajectory_id or "", record.partition, record.offset, data)
            if time.monotonic() - last_report > WAIT_LOG_S:
                last_report = time.monotonic()
                log.warning("group %s waits for trajectories %s (not read yet or evicted)", group_id, missing)
        return self.buffer.take(group.members)

    async def _train(self, batch: StepBatch, wait: WaitSplit, producer: EventProducer) -> None:
        samples = batch.samples
        staleness = batch_staleness(samples, self.state.version)
        self._phase("update", self.state.step + 1)
        # on the compute thread: the loop keeps its heartbeat (a supervisor must not take a long step
        # for a hang) and Kafka's group session; the consumers are paused meanwhile
        metrics = await on_compute(self.backend.rl_step, samples)
        self.state.step += 1
        self.state.version += 1
        self.state.offsets = {
            "groups": self.merger.taken_positions(),
            "trajectories": self.buffer.lowest_needed(self.trajectory_positions),
        }
        blocked_from = time.monotonic()
        await self.publisher.drain()  # the version before is out: in order, one snapshot held
        self._phase("publish")
        weights = await on_compute(version_file, self.backend, self.target, self.stage)
        publish_s = time.monotonic() - blocked_from
        data = step_payload(
            metrics,
            step=self.state.step,
            version=self.state.version,
            group_ids=batch.group_ids,
            seen=self.seen,
            staleness_mean=staleness.mean,
            staleness_max=staleness.max,
            times=step_times(metrics, publish_s, wait),
        )
        self.seen = Counter()
        self.publisher.start(self._publish(producer, weights, data))
        if not self.settings.publish_in_background:
            await self.publisher.drain()

    async def _publish(self, producer: EventProducer, weights: memoryview, data: TrainerStep) -> None:
        """Write and announce the step's version, then send its `trainer.steps` event (in the background)."""
        started = time.monotonic()
        await publish_version(
            producer,
            self.target,
            weights,
            step=data.step,
            version=data.version,
            before_rename=functools.partial(self._phase, "publish.rename", data.step, data.version),
            keep=self.settings.keep_versions,
        )
        elapsed, times = time.monotonic() - started, data.times
        if self.settings.publish_in_background:
            times = times.model_copy(update={"publish_background_s": elapsed})
        else:  # on the step's path: part of its time
            on_path = {"publish_s": times.publish_s + elapsed, "total_s": times.total_s + elapsed}
            times = times.model_copy(update=on_path)
        data = data.model_copy(update={"times": times})
        await producer.send("trainer.steps", step_event(self.target.run_id, data, time.time_ns()))
        await producer.flush()
        log.info(
            "step=%d version=%d loss=%.4f grad_norm=%.4f tokens=%d wait=%.2fs update=%.2fs publish=%.2fs "
            "(background %.2fs)",
            data.step,
            data.version,
            data.loss,
            data.grad_norm,
            data.tokens,
            times.wait_s,
            times.logprob_s + times.update_s,
            times.publish_s,
            times.publish_background_s,
        )

    def _phase(self, name: str, step: int | None = None, version: int | None = None) -> None:
        step = self.state.step if step is None else step
        version = self.state.version if version is None else version
        log.info("phase=%s step=%d version=%d", name, step, version)
        if self.settings.phase_pause_s:
            time.sleep(self.settings.phase_pause_s)


@contextlib.contextmanager
def _paused(*consumers: EventConsumer) -> Iterator[None]:
    """Stop the consumers' background fetches while a step trains and publishes."""
    for consumer in consumers:
        consumer.consumer.pause(*consumer.consumer.assignment())
    try:
        yield
    finally:
        for consumer in consumers:
            consumer.consumer.resume(*consumer.consumer.assignment())
