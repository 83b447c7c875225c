"""Which train task the next RL group asks for (pure): round robin, solved tasks sitting out.

A group whose attempts all succeed has zero advantage everywhere: the stream worker drops
it (`zero_variance`) and the trainer learns nothing from it, yet its episodes took the
same sandboxes and engine time as a useful group. As the policy improves such groups
come to dominate (seen in `bench learning`: ~70% of groups, then ~96%, steps slowing
from ~30 s to minutes), so a task whose group came back solved by every attempt sits out
(easy-task filtering, as in Polaris; DAPO's dynamic sampling drops such groups only after
they ran). A task every attempt failed stays: a later policy may solve part of it.

Retirement is for good unless `return_rounds` > 0: then a solved task comes back after
`return_rounds` rounds of the task list (counted in groups requested, not time), twice as
long each further time it is solved. The question it answers: retired for good, the tasks
a policy solves early leave for the rest of the run and the open ones are skewed to what it
gets wrong (in `bench learning` the comparison tasks went first, and late in the run the
policy applied the negation fix to comparison lines too). Returning tasks show such drift
as failures. Measured on seed 2 with 1 round, it did not pay: 852 groups instead of ~520
in 50 steps, 387 of them solved in every attempt, and the same held-out confusion. When
every task sits out (`all_sit_out`) the round robin takes all again; the learning run
ends RL there instead (`learning.end_when_train_solved`).

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
    """Round robin over `tasks` task indices; with `retire_solved`, solved tasks sit out
    (for good when `return_rounds` is 0)."""

    tasks: int
    retire_solved: bool = True
    return_rounds: int = 0
    asked: list[int] = field(init=False)  # groups requested so far, per task
    times_solved: dict[int, int] = field(init=False, default_factory=dict)  # per task solved at least once
    back_at: dict[int, int] = field(init=False, default_factory=dict)  # groups requested when it returns
    task_of_group: dict[str, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.tasks < 1:
            raise ValueError(f"a curriculum needs at least one task, got {self.tasks}")
        if self.return_rounds < 0:
            raise ValueError(f"return_rounds must be >= 0 (0 = retired for good), got {self.return_rounds}")
        self.asked = [0] * self.tasks

    @property
    def solved(self) -> set[int]:
        """Tasks a group solved in every attempt at least once."""
        return set(self.times_solved)

    @property
    def all_sit_out(self) -> bool:
        """Every task sits out now: each next group would be of a task a whole group has solved."""
        return not self._open_tasks()

    def next(self) -> tuple[int, int]:
        """(task index, that task's group index) of the next group: the least-asked open task."""
        open_tasks = self._open_tasks() or list(range(self.tasks))
        task = min(open_tasks, key=lambda t: (self.asked[t], t))
        index = self.asked[task]
        self.asked[task] += 1
        return task, index

    def _open_tasks(self) -> list[int]:
        total = sum(self.asked)
        return [t for t in range(self.tasks) if not self._sits_out(t, total)]

    def _sits_out(self, task: int, requested_total: int) -> bool:
        if task not in self.times_solved:
            return False
        return self.return_rounds == 0 or requested_total < self.back_at[task]

    def requested(self, group_id: str, task: int) -> None:
        self.task_of_group[group_id] = task

    def observe(self, group_id: str, group: GroupFormed) -> None:
        """A formed group of this run: its task sits out when every attempt solved it."""
        task = self.task_of_group.get(group_id)
        if self.retire_solved and task is not None and solved_by_every_attempt(group):
            times = self.times_solved.get(task, 0) + 1
            self.times_solved[task] = times
            self.back_at[task] = sum(self.asked) + self.return_rounds * self.tasks * 2 ** (times - 1)
