"""Which train task the next RL group asks for (pure): round robin, skipping tasks already solved.

A group whose attempts all succeed has zero advantage everywhere: the stream worker drops
it (`zero_variance`) and the trainer learns nothing from it, yet its episodes took the
same sandboxes and engine time as a useful group. As the policy improves such groups
come to dominate (seen in `bench learning`: ~70% of groups, then ~96%, steps slowing
from ~30 s to minutes), so a task whose group came back solved by every attempt is not
asked for again in this run (easy-task filtering, as in Polaris; DAPO's dynamic sampling
drops such groups only after they ran). A task every attempt failed stays: a later
policy may solve part of it. When every task is solved the round robin takes all again.

`TaskPicker` is a small state machine fed from the log (the groups' records), so the
same log gives the same choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streams.payloads import GroupFormed


def solved_by_every_attempt(group: GroupFormed) -> bool:
    """Dropped for zero variance with a positive reward in every attempt."""
    return group.dropped == "zero_variance" and bool(group.rewards) and min(group.rewards) > 0


@dataclass
class TaskPicker:
    """Round robin over `tasks` task indices; with `retire_solved`, solved tasks leave it."""

    tasks: int
    retire_solved: bool = True
    asked: list[int] = field(init=False)  # groups requested so far, per task
    solved: set[int] = field(init=False, default_factory=set)
    task_of_group: dict[str, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.tasks < 1:
            raise ValueError(f"a curriculum needs at least one task, got {self.tasks}")
        self.asked = [0] * self.tasks

    def next(self) -> tuple[int, int]:
        """(task index, that task's group index) of the next group: the least-asked open task."""
        open_tasks = [t for t in range(self.tasks) if t not in self.solved] or list(range(self.tasks))
        task = min(open_tasks, key=lambda t: (self.asked[t], t))
        index = self.asked[task]
        self.asked[task] += 1
        return task, index

    def requested(self, group_id: str, task: int) -> None:
        self.task_of_group[group_id] = task

    def observe(self, group_id: str, group: GroupFormed) -> None:
        """A formed group of this run: retire its task when every attempt solved it."""
        task = self.task_of_group.get(group_id)
        if self.retire_solved and task is not None and solved_by_every_attempt(group):
            self.solved.add(task)
