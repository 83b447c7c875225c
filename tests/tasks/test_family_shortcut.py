"""A blind fix costs something on the learning family: on held-out tasks the "apply every fix" policy
scores 0 (the target is at most 1/4), one fix guessed blind scores 1/4, and "read the failing line,
apply its kind's fix" scores 1. Measured through the real runner, bubblewrap sandbox and verifier on
a few tasks, where the pure judge (`case_outcomes`) is shown to agree, and through the pure judge on
many more."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine
from pathlib import Path

import pytest

from agents.expert import SHOWN_LINE
from sandboxes.backends import make_factory
from sandboxes.settings import SandboxSettings
from sandboxes.tasks.family import (
    KINDS,
    RUN_TESTS,
    BugKind,
    FamilyTask,
    apply_fixes,
    case_outcomes,
    family_tasks,
    kind_of_line,
    write_family,
)
from sandboxes.tasks.harbor import Task
from sandboxes.tasks.verifier import run_verifier

EVERY_FIX = KINDS
AT_ONCE = 2  # sandboxes in parallel: the machine has 2 cores


def _resolved(task: FamilyTask, lib: str) -> bool:
    return all(case_outcomes(lib, task.cases).values())


def _read_kind(task: FamilyTask) -> BugKind | None:
    """The kind of the line `run_tests.py` shows: the return line of the first failing case's function."""
    failing = next(test for test, ok in case_outcomes(task.lib, task.cases).items() if not ok)
    function = re.search(r"::(\w+)\[", failing).group(1)  # type: ignore[union-attr]
    body = task.lib.split(f"def {function}(", 1)[1].splitlines()[1]
    return kind_of_line(body)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_pure_judge_every_fix_fails_a_blind_fix_scores_a_quarter_reading_scores_one(seed: int) -> None:
    tasks = family_tasks("heldout", 64, seed)
    every = sum(_resolved(t, apply_fixes(EVERY_FIX, t.lib)) for t in tasks) / len(tasks)
    reading = sum(_resolved(t, apply_fixes((_read_kind(t) or KINDS[0],), t.lib)) for t in tasks) / len(tasks)
    blind = {k.name: sum(_resolved(t, apply_fixes((k,), t.lib)) for t in tasks) / len(tasks) for k in KINDS}
    assert every <= 0.25 and every == 0.0
    assert reading == 1.0
    assert blind == dict.fromkeys(blind, 0.25)  # each kind is the bug in a quarter of the tasks


async def _reward_after(task: Task, command: str) -> tuple[float, str]:
    """(verifier reward, the command's stdout) after `command` runs in a fresh sandbox of `task`."""
    box = make_factory(SandboxSettings()).create(task.workspace)
    await box.start()
    try:
        ran = await box.exec(command, timeout=60)
        return (await run_verifier(box, task, task.verifier_timeout_s)).reward, ran.stdout
    finally:
        await box.stop()


async def _read_then_fix(task: Task) -> tuple[float, str]:
    """Run the tests, read the shown line and apply its kind's fix (in one sandbox, as an agent would)."""
    box = make_factory(SandboxSettings()).create(task.workspace)
    await box.start()
    try:
        shown = SHOWN_LINE.findall((await box.exec(RUN_TESTS, timeout=60)).stdout)
        kind = kind_of_line(shown[-1]) if shown else None
        assert kind is not None, f"{task.id}: no shown line with a telltale in the test output"
        assert (await box.exec(kind.fix_command, timeout=60)).ok
        return (await run_verifier(box, task, task.verifier_timeout_s)).reward, kind.name
    finally:
        await box.stop()


def _fixes(kinds: tuple[BugKind, ...]) -> str:
    return " && ".join(kind.fix_command for kind in kinds)


def test_real_sandboxes_every_fix_fails_a_blind_fix_scores_a_quarter_reading_scores_one(
    tmp_path: Path,
) -> None:
    seed, n = 5, 8
    written = write_family(tmp_path, "heldout", n, seed)
    pure = family_tasks("heldout", n, seed)
    policies = {"every": EVERY_FIX, **{kind.name: (kind,) for kind in KINDS}}

    async def run_all() -> tuple[list[tuple[float, str]], list[list[tuple[float, str]]]]:
        gate = asyncio.Semaphore(AT_ONCE)

        async def gated(job: Coroutine[object, object, tuple[float, str]]) -> tuple[float, str]:
            async with gate:
                return await job

        reads = await asyncio.gather(*(gated(_read_then_fix(task)) for task in written))
        rows = [
            asyncio.gather(*(gated(_reward_after(t, _fixes(f))) for f in policies.values())) for t in written
        ]
        return list(reads), [list(row) for row in await asyncio.gather(*rows)]

    reads, blind = asyncio.run(run_all())
    assert [reward for reward, _ in reads] == [1.0] * n
    assert [kind for _, kind in reads] == [task.kind for task in pure]
    scores = {name: sum(row[i][0] for row in blind) / n for i, name in enumerate(policies)}
    assert scores["every"] <= 0.25 and scores["every"] == 0.0
    assert [scores[kind.name] for kind in KINDS] == [0.25] * len(KINDS)  # 2 tasks of each kind in 8
    for task, row in zip(pure, blind, strict=True):  # the pure judge agrees with the real verifier
        for (reward, _), fixes in zip(row, policies.values(), strict=True):
            assert reward == float(_resolved(task, apply_fixes(fixes, task.lib))), (task.id, fixes)
