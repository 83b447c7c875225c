"""Feeding an RL run: groups of train tasks submitted ahead of the trainer, and its progress.

`feed_until_trained` keeps `learning.rl_groups_ahead` groups unsettled until the trainer (started
by `rollstream.learning.start_rl_processes`) exits; `GroupLedger` counts a run's groups from
`groups` and `trainer.steps`; `submit_next_group` writes one group's requests. The demo,
`bench learning` and `bench chaos` use them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agents.curriculum import TaskPicker
from agents.identity import group_id
from agents.submit import TaskRef, limits_of, request_event, task_refs
from rollstream.config import Config
from rollstream.learning import LearningPaths
from rollstream.supervisor import Supervisor
from streams.bus import EventConsumer, EventProducer
from streams.payloads import GroupFormed, TrainerStep
from trainer.intake import STALE


@dataclass(frozen=True)
class RlProgress:
    step: int
    groups_formed: int
    groups_submitted: int
    tasks_solved: int = 0  # train tasks retired by the curriculum
    train_solved: bool = False  # RL ended before its steps: every train task sits out


ProgressFn = Callable[[RlProgress], None]


async def feed_until_trained(
    cfg: Config,
    paths: LearningPaths,
    run_id: str,
    pipeline: Supervisor,
    on_progress: ProgressFn | None = None,
) -> RlProgress:
    """Submit groups of train tasks until the trainer exits, keeping at most `rl_groups_ahead` groups
    unsettled (requested but neither trained on nor dropped), so no work waits long enough to go stale.
    Tasks come from `TaskPicker` (solved ones sitting out: `learning.retire_solved_tasks`,
    `learning.retired_return_rounds`). With `learning.end_when_train_solved` it returns as soon as
    every task sits out (`train_solved`), the trainer still running: the caller's `Supervisor` stops
    it, and its last published version is the RL model."""
    refs = task_refs(paths.train_tasks)
    learning = cfg.learning
    ledger = GroupLedger()
    picker = TaskPicker(len(refs), learning.retire_solved_tasks, learning.retired_return_rounds)
    shorts = ("groups", "trainer.steps")
    async with (
        EventProducer(cfg.kafka, cfg.topics) as producer,
        EventConsumer(cfg.kafka, cfg.topics, shorts, group_id=None, name=f"feed-{run_id}") as consumer,
    ):
        while not pipeline.done("trainer"):
            if learning.end_when_train_solved and picker.all_sit_out:
                return ledger.progress(len(picker.solved), train_solved=True)
            while ledger.unsettled < cfg.learning.rl_groups_ahead:
                await submit_next_group(cfg, producer, run_id, refs, picker)
                ledger.submitted += 1
            await producer.flush()
            for item in await consumer.batch(timeout_ms=500):
                if item.event.run_id == run_id:
                    ledger.record(item.event.data)
                    if isinstance(item.event.data, GroupFormed):
                        picker.observe(item.event.group_id or "", item.event.data)
            pipeline.check_alive()
            if on_progress is not None:
                on_progress(ledger.progress(len(picker.solved)))
    return ledger.progress(len(picker.solved))


@dataclass
class GroupLedger:
    """Groups of an RL run: requested, formed, dropped and trained on; `unsettled` is what is still
    to be trained on or dropped. The trainer's stale count includes groups the stream worker had
    already dropped as stale, so only its excess over those is the trainer's own."""

    submitted: int = 0
    formed: int = 0
    dropped: int = 0  # by the stream worker, any reason
    dropped_stale: int = 0  # by the stream worker, as stale
    trainer_stale: int = 0
    trained: int = 0
    step: int = 0

    def record(self, data: object) -> None:
        if isinstance(data, GroupFormed):
            self.formed += 1
            self.dropped += data.dropped is not None
            self.dropped_stale += data.dropped == STALE
        elif isinstance(data, TrainerStep) and data.mode == "rl":
            self.step = max(self.step, data.step)
            self.trained += len(data.group_ids)
            self.trainer_stale += data.stale_groups

    @property
    def unsettled(self) -> int:
        own_stale = max(0, self.trainer_stale - self.dropped_stale)
        return self.submitted - self.dropped - own_stale - self.trained

    def progress(self, tasks_solved: int = 0, *, train_solved: bool = False) -> RlProgress:
        return RlProgress(self.step, self.formed, self.submitted, tasks_solved, train_solved)


async def submit_next_group(
    cfg: Config,
    producer: EventProducer,
    run_id: str,
    refs: list[TaskRef],
    picker: TaskPicker,
    source: str = "learning",
) -> str:
    """`group_size` requests for the task `picker` chooses; the group's id."""
    task, index = picker.next()
    group = group_id(run_id, refs[task].task_id, index)
    picker.requested(group, task)
    size = cfg.policy.group_size
    for attempt in range(size):
        event = request_event(
            run_id=run_id,
            group=group,
            task=refs[task],
            attempt=attempt,
            retry=0,
            group_size=size,
            limits=limits_of(cfg.policy),
            source=source,
        )
        await producer.send("rollout.requests", event)
    return group
