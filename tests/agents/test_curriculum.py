"""The RL feed's task choice: round robin, solved tasks retired, failed ones kept."""

from __future__ import annotations

import pytest

from agents.curriculum import TaskPicker, solved_by_every_attempt
from streams.payloads import GroupFormed
from streams.settings import PolicySettings


def _group(rewards: list[float], dropped: str | None) -> GroupFormed:
    n = len(rewards)
    return GroupFormed(
        members=[f"t{i}" for i in range(n)],
        rewards=rewards,
        advantages=[0.0] * n,
        dropped=dropped,
        policy=PolicySettings(),
    )


def _ask(picker: TaskPicker, n: int) -> list[tuple[int, int]]:
    picked = []
    for _ in range(n):
        task, index = picker.next()
        picker.requested(f"g{task}-{index}", task)
        picked.append((task, index))
    return picked


def test_round_robin_gives_each_task_its_next_group_index() -> None:
    assert _ask(TaskPicker(3), 7) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 2)]


def test_a_task_solved_in_every_attempt_is_not_asked_for_again_and_a_failed_one_is() -> None:
    picker = TaskPicker(3)
    _ask(picker, 3)
    picker.observe("g0-0", _group([1.0] * 4, "zero_variance"))  # solved: retired
    picker.observe("g1-0", _group([0.0] * 4, "zero_variance"))  # failed everywhere: stays
    picker.observe("g2-0", _group([1.0, 0.0, 1.0, 0.0], None))  # kept: stays
    assert [task for task, _ in _ask(picker, 4)] == [1, 2, 1, 2]
    assert picker.solved == {0}


def test_when_every_task_is_solved_all_come_back_and_without_retiring_none_leave() -> None:
    picker = TaskPicker(2)
    _ask(picker, 2)
    picker.observe("g0-0", _group([1.0] * 4, "zero_variance"))
    assert not picker.all_sit_out
    picker.observe("g1-0", _group([1.0] * 4, "zero_variance"))
    assert picker.all_sit_out  # where the learning run ends RL (learning.end_when_train_solved)
    assert [task for task, _ in _ask(picker, 2)] == [0, 1]
    returning = TaskPicker(1, return_rounds=1)
    _ask(returning, 1)
    returning.observe("g0-0", _group([1.0] * 4, "zero_variance"))
    assert returning.all_sit_out
    _ask(returning, 1)  # one round of the task list later it is back
    assert not returning.all_sit_out
    keep_all = TaskPicker(2, retire_solved=False)
    _ask(keep_all, 2)
    keep_all.observe("g0-0", _group([1.0] * 4, "zero_variance"))
    assert [task for task, _ in _ask(keep_all, 2)] == [0, 1] and not keep_all.solved
    assert not keep_all.all_sit_out


def test_only_groups_dropped_for_zero_variance_with_rewards_count_as_solved() -> None:
    assert solved_by_every_attempt(_group([1.0, 1.0], "zero_variance"))
    assert not solved_by_every_attempt(_group([1.0, 1.0], "stale"))
    assert not solved_by_every_attempt(_group([0.0, 0.0], "zero_variance"))
    picker = TaskPicker(2)
    picker.observe("unknown-group", _group([1.0, 1.0], "zero_variance"))  # another run's: ignored
    assert not picker.solved
    with pytest.raises(ValueError, match="at least one task"):
        TaskPicker(0)


def test_with_return_rounds_a_solved_task_comes_back_and_sits_out_twice_as_long_when_solved_again() -> None:
    picker = TaskPicker(3, return_rounds=1)
    _ask(picker, 3)
    picker.observe("g0-0", _group([1.0] * 4, "zero_variance"))  # back after 3 more groups
    assert [task for task, _ in _ask(picker, 3)] == [1, 2, 1]
    assert _ask(picker, 1) == [(0, 1)]  # it returns with its own next group index
    picker.observe("g0-1", _group([1.0] * 4, "zero_variance"))  # solved again: out for 6 groups
    assert [task for task, _ in _ask(picker, 6)] == [2, 1, 2, 1, 2, 1]
    assert _ask(picker, 1) == [(0, 2)]
    assert picker.solved == {0} and picker.times_solved == {0: 2}
    with pytest.raises(ValueError, match="return_rounds"):
        TaskPicker(2, return_rounds=-1)
